"""Everything kftrain publishes as YAML: the pipelines, and each component on its own (for
`kfp.components.load_component_from_file` in anyone's pipeline)."""

from components.configure import configure
from components.data_prep import data_prep
from components.evaluate import evaluate
from components.export import export
from components.gate import quality_gate_failed
from components.plan import plan
from components.pytorchjob import pytorchjob
from components.train import train
from pipelines.training import training_pipeline

#: compiled/<name>.yaml
PIPELINES = {"training_pipeline": training_pipeline}
#: compiled/components/<name>.yaml
COMPONENTS = {
    "configure": configure,
    "plan": plan,
    "data_prep": data_prep,
    "train": train,
    "evaluate": evaluate,
    "export": export,
    "quality_gate_failed": quality_gate_failed,
    "pytorchjob": pytorchjob,
}
