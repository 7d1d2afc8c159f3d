"""One module per ``python -m bench --only`` section."""
