"""The `edgeattn` command line: thin commands over the library API, loaded lazily."""
