"""Example run configs shipped as package data (train_default.toml documents every key)."""
