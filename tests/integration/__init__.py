"""Integration tier: tests that start processes (torchrun, kfp.local, the CLI) or servers (S3)."""
