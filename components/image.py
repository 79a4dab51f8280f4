"""The one image setting: every step and every training replica runs this image.

Build and push it from the repository's Dockerfile; to use your own registry, change this tag
and recompile (`kftrain compile`), or pass `image` to the pipeline for the training replicas.
"""

IMAGE = "ghcr.io/kftrain/kftrain:0.1.0"
