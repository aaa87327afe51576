"""kubetf trainer image: the phases of a run and progress reports, from unchanged training programs.

Python imports this module at start (it is on PYTHONPATH=/opt/kubetf). In a task of a job (TF_CONFIG or KUBETF_ROLE
set) it says when the process started and when TensorFlow's import ended (``kubetf_trainer.phases``; KUBETF_PHASES=0
turns that off); in a MultiWorkerMirrored task with a checkpoint volume it leaves a token of the process there, by
which the group's chief sees at once that this task restarted (``kubetf_trainer.peers``). When the operator set
KUBETF_PROGRESS_URL, on the task that coordinates training, it adds a reporting callback to every Keras
``Model.fit`` and recognises the TensorFlow guides' printed progress lines (``kubetf_trainer.autoreport``;
KUBETF_PROGRESS_AUTO=0 turns it off; see trainer_image/README.md). It imports no TensorFlow, and any error in it
leaves the program running as it would without it. A ``sitecustomize`` further along sys.path still runs.
"""


def _kubetf(module: str):  # -> the module, or None
    """Import ``kubetf_trainer.<module>``, leaving TF_USE_LEGACY_KERAS as it found it (importing kubetf_trainer sets
    it by default: not for an unchanged program)."""
    import importlib
    import os

    had_legacy_keras = "TF_USE_LEGACY_KERAS" in os.environ
    try:
        return importlib.import_module(f"kubetf_trainer.{module}")
    except Exception:
        return None
    finally:
        if not had_legacy_keras:
            os.environ.pop("TF_USE_LEGACY_KERAS", None)


def _kubetf_phases() -> None:
    import os

    if not (os.environ.get("TF_CONFIG") or os.environ.get("KUBETF_ROLE")):
        return
    try:
        phases = _kubetf("phases")
        if phases is not None:
            phases.install()
    except Exception:
        pass


def _kubetf_peers() -> None:
    import os

    if os.environ.get("KUBETF_STRATEGY") != "MultiWorkerMirrored" or not os.environ.get("KUBETF_CHECKPOINT_DIR"):
        return
    try:
        peers = _kubetf("peers")
        if peers is not None:
            peers.announce()
    except Exception:
        pass


def _kubetf_progress() -> None:
    import os

    if not os.environ.get("KUBETF_PROGRESS_URL"):
        return
    try:
        autoreport = _kubetf("autoreport")
        if autoreport is not None:
            autoreport.install()
    except Exception:
        pass


def _next_sitecustomize() -> None:
    """Run the sitecustomize this one hides (a distribution's own), if there is one later on sys.path."""
    try:
        import importlib.machinery
        import importlib.util
        import os
        import sys

        here = os.path.dirname(os.path.abspath(__file__))
        rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None or os.path.abspath(spec.origin or "") == os.path.abspath(__file__):
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules["_kubetf_next_sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception:
        pass


_kubetf_phases()
_kubetf_peers()
_kubetf_progress()
_next_sitecustomize()
