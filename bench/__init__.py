"""Benchmarks that print ratios against a peer measured in the same run (`make bench`)."""
