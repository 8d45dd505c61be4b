"""End-to-end jobs behind the recipes and the CLI."""
