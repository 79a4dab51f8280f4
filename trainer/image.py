"""The one image setting: every pipeline step and every training replica runs this image
(`job.image`'s default; the components' base image).

Build and push it from the repository's Dockerfile; to use your own registry, change this tag
and recompile (`kftrain compile`), or pass `image` to the pipeline for the training replicas of a
run.
"""

IMAGE = "ghcr.io/kftrain/kftrain:0.1.0"
