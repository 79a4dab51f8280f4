"""Unit tier: no subprocess, no server; runs in well under a minute."""
