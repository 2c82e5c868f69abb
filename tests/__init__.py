"""The test suite by package (snapshot, store, pool, client, cli, protocol, system); shared helpers at this level."""
