"""gem_core.experiment's launch-script pieces every one-command trainer shares (verl, OpenRLHF, RL2, oat): the
hydra overrides (verl's and RL2's) and the script around the trainer's command."""

from gem_core.experiment import Experiment
from gem_core.experiment_scripts import hydra_overrides, hydra_value, launch_script

PRECISION = {"bf16": {"DTYPE": "bf16"}, "float32": {"DTYPE": "fp32"}}


def test_hydra_values_in_hydra_syntax():
    assert [hydra_value(v) for v in (None, True, False, 3, 0.5, "$MODEL")] == ["null", "true", "false", "3", "0.5", "$MODEL"]
    assert hydra_value([0.9, None, "a"]) == "[0.9,null,a]"
    # verl's configs spell booleans as Python does; hydra reads both
    assert [hydra_value(v, python_bools=True) for v in (True, [False, 1])] == ["True", "[False,1]"]


def test_hydra_overrides_in_the_settings_order():
    settings = {"b.x": 1, "a.y": None, "+c.z": False}
    assert hydra_overrides(settings) == ["b.x=1", "a.y=null", "+c.z=false"]
    assert hydra_overrides(settings, python_bools=True)[2] == "+c.z=False"


def test_launch_script_datasets_precision_note_then_the_command_with_the_scripts_arguments():
    experiment = Experiment(precision="float32")
    text = launch_script("t", experiment, "x.toml", [["gem-core", "make-dataset", "t"]], PRECISION, ["run", "--a", "1"], "# a note")
    lines = text.splitlines()
    assert lines[0] == "#!/usr/bin/env bash" and "x.toml" in lines[1]
    tail = lines[lines.index("gem-core make-dataset t") :]
    assert tail == [
        "gem-core make-dataset t",
        '# training.precision = "float32": the update in float32 throughout',
        "DTYPE=fp32",
        "# a note",
        "run \\",
        "  --a 1 \\",
        '  "$@"',
    ]
    assert "# a note" not in launch_script("t", experiment, "x.toml", [], PRECISION, ["run"])
