"""The client processes the end-to-end sections drive a broker with."""
