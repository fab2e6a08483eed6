"""The `attnscope` command line: a thin layer over the library."""
