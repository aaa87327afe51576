"""`kubetf local` with an interpreter that has no TensorFlow (what `pip install .` alone gives)."""

import subprocess
import sys

import yaml


def test_local_says_what_to_install_before_starting_anything(tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    job = {
        "apiVersion": "kubetf.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "needs-tf"},
        "spec": {
            "replicaSpecs": {
                "worker": {
                    "replicas": 2,
                    "template": {
                        "spec": {"containers": [{"name": "tensorflow", "image": "x", "command": ["python", "t.py"]}]}
                    },
                }
            }
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    python = bare / "bin" / "python"
    result = subprocess.run(
        [sys.executable, "-m", "kubetf.cli", "local", "-f", str(path), "--python", str(python),
         "--workdir", str(tmp_path / "w")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr == (
        f"kubetf-local | {python} cannot import tensorflow (worker-0 runs it): install the trainer extra into it "
        "(pip install '.[trainer]' in a kubetf checkout: tensorflow-cpu, tf-keras, scikit-learn), or name an "
        "interpreter that has TensorFlow with --python\n"
    )
    assert "started" not in result.stdout
