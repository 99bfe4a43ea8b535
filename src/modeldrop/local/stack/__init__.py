"""The SAM stack, emulated: its resources and functions read from template.yaml (`emulated`), built in
moto as `sam deploy` would make them (`build`), sealed from the shell's AWS settings (`hermetic`),
and kept running as a server for every command by `modeldrop local up` (`daemon`)."""
