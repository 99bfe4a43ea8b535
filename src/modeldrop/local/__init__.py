"""The laptop path: the real ASL and handlers over moto (needs the `local` extra)."""
