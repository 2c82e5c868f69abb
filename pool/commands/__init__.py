"""clink-pool subcommands: every module here exposing COMMANDS is added to the `clink-pool` group."""
