"""kftrain's compiled component YAMLs, loaded whole into a pipeline of your own.

kfp 2.17's `kfp.components.load_component_from_file` drops a component's
`taskConfigPassthroughs`: loaded so, the `train` component would give the task's resources,
environment, tolerations, node selector, affinity and volumes to its launcher pod, and its
training replicas none of them (docs/components.md, "Task settings"). :func:`load_component`
puts them back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_component(path: str | Path) -> Any:
    """The component in the compiled YAML at `path`, as `kfp.components.load_component_from_file`
    loads it, with the `taskConfigPassthroughs` the file declares."""
    import yaml
    from kfp import components
    from kfp.dsl import TaskConfigField, TaskConfigPassthrough

    component = components.load_component_from_file(str(path))
    # The pipeline spec is the first document (a compiled pipeline's second is its platform spec).
    spec = next(yaml.safe_load_all(Path(path).read_text()), None) or {}
    declared = (spec.get("root") or {}).get("taskConfigPassthroughs") or []
    if declared:
        component.component_spec.task_config_passthroughs = [
            TaskConfigPassthrough(field=TaskConfigField[p["field"]], apply_to_task=bool(p.get("applyToTask")))
            for p in declared
        ]
    return component
