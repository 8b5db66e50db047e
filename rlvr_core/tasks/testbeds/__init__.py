"""Built-in testbed TOML files (a package only so that the .toml files ship as package data)."""
