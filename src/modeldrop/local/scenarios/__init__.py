"""`modeldrop run-local`: one deployment end to end (`run`), its inputs put into the emulated bucket
(`inputs`), the faults that reshape the account or the execution (`account_faults`), a shared
deployment's adapters (`shared`), a channel's day (`channel`), and clean stops on a signal
(`interrupts`). The top of `local`: nothing else in it imports these."""
