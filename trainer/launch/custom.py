"""The old name of :mod:`trainer.launch.byo`, kept only for compiled component YAML.

The `pytorchjob` component's body, compiled verbatim into `compiled/components/pytorchjob.yaml`,
imports `custom_job` from here; an image must keep serving that published file. New code
imports :func:`trainer.launch.byo.byo_job`. Delete this module together with a recompile that
changes the component's import.
"""

from trainer.launch.byo import byo_job as custom_job

__all__ = ["custom_job"]
