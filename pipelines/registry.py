"""Every pipeline kftrain ships, by the file name its compiled YAML gets."""

from pipelines.training import training_pipeline

PIPELINES = {"training_pipeline": training_pipeline}
