"""Training data for the examples: real MNIST when it can be had, else data a package ships.

``load(kind)`` returns ``(x_train, y_train), (x_test, y_test)`` as numpy arrays: float32 images of
shape (n, 28, 28) in [0, 1] and int64 labels 0-9, whatever the source.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
import sys
from typing import Any

import numpy as np

log = logging.getLogger("kubetf_trainer")

KINDS = ("auto", "mnist", "digits", "synthetic")
Arrays = tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def mnist(cache_dir: str, timeout: float = 20.0) -> Arrays:
    """The tutorial's ``tf.keras.datasets.mnist.load_data``, cached as ``cache_dir/mnist.npz``."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    os.makedirs(cache_dir, exist_ok=True)
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(timeout)
    try:
        (x_train, y_train), (x_test, y_test) = tf.keras.datasets.mnist.load_data(
            path=os.path.join(os.path.abspath(cache_dir), "mnist.npz")
        )
    finally:
        socket.setdefaulttimeout(old)
    return (
        (x_train.astype(np.float32) / 255.0, y_train.astype(np.int64)),
        (x_test.astype(np.float32) / 255.0, y_test.astype(np.int64)),
    )


def _to_mnist_layout(images8: np.ndarray) -> np.ndarray:
    """8x8 digits (0-16) -> 28x28 in [0, 1]: upscaled to 20x20 and centred like MNIST's digits."""
    n = images8.shape[0]
    src = images8.astype(np.float32) / 16.0
    # bilinear resize 8 -> 20 with numpy (no TensorFlow needed)
    pos = (np.arange(20) + 0.5) * 8 / 20 - 0.5
    lo = np.clip(np.floor(pos).astype(int), 0, 7)
    hi = np.clip(lo + 1, 0, 7)
    w = np.clip(pos - lo, 0.0, 1.0).astype(np.float32)
    rows = src[:, lo, :] * (1 - w)[None, :, None] + src[:, hi, :] * w[None, :, None]
    out = rows[:, :, lo] * (1 - w)[None, None, :] + rows[:, :, hi] * w[None, None, :]
    padded = np.zeros((n, 28, 28), dtype=np.float32)
    padded[:, 4:24, 4:24] = out
    return np.clip(padded, 0.0, 1.0)


def digits(test_fraction: float = 0.15, seed: int = 0) -> Arrays:
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images), in MNIST's layout. No download."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = _to_mnist_layout(np.asarray(bunch.images))
    y = np.asarray(bunch.target, dtype=np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    n_test = int(len(x) * test_fraction)
    return (x[n_test:], y[n_test:]), (x[:n_test], y[:n_test])


def synthetic(n_train: int = 4096, n_test: int = 512, seed: int = 0) -> Arrays:
    """Learnable random data: ten fixed 28x28 prototypes plus noise."""
    rng = np.random.default_rng(seed)
    prototypes = (rng.random((10, 28, 28)) > 0.7).astype(np.float32)

    def make(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, 10, size=n).astype(np.int64)
        x = prototypes[y] * 0.8 + rng.random((n, 28, 28)).astype(np.float32) * 0.4
        return np.clip(x, 0.0, 1.0).astype(np.float32), y

    return make(n_train), make(n_test)


def load(kind: str = "auto", cache_dir: str | None = None) -> Arrays:
    """``auto``: MNIST if it can be loaded (cache or download), else one log line and ``digits``; and ``digits`` once
    chosen (kept in the cache as ``digits.npz``) from then on, without asking for MNIST again: a job's restarts train
    on the data it began with, and start without scikit-learn's import (half a second on 2 cores)."""
    if kind not in KINDS:
        raise ValueError(f"--data {kind!r}: expected one of {', '.join(KINDS)}")
    cache = cache_dir or os.path.join(os.path.expanduser("~"), ".keras", "datasets")
    if kind == "mnist":
        return mnist(cache)
    if kind == "digits":
        return _digits(cache)
    if kind == "synthetic":
        return synthetic()
    if not os.path.exists(os.path.join(cache, "mnist.npz")) and (kept := _kept_digits(cache)) is not None:
        print(f"kubetf_trainer: scikit-learn digits, as this job began with (MNIST was not available; {cache})")
        return kept
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):  # Keras' "Downloading data from ..." line
            arrays = mnist(cache)
        sys.stdout.write(buffer.getvalue())
        return arrays
    except Exception as exc:
        reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        print(
            f"kubetf_trainer: MNIST not available ({reason}); using scikit-learn digits instead",
            flush=True,
        )
        return _digits(cache)


DIGITS_FILE = "digits.npz"


def _kept_digits(cache: str) -> Arrays | None:
    try:
        with np.load(os.path.join(cache, DIGITS_FILE)) as f:
            return (f["x_train"], f["y_train"]), (f["x_test"], f["y_test"])
    except (OSError, KeyError, ValueError):
        return None


def _digits(cache: str) -> Arrays:
    """``digits``, from the cache when there (written once, atomically: the job's tasks start together)."""
    kept = _kept_digits(cache)
    if kept is not None:
        return kept
    arrays = digits()
    (x_train, y_train), (x_test, y_test) = arrays
    with contextlib.suppress(OSError):
        os.makedirs(cache, exist_ok=True)
        tmp = os.path.join(cache, f".{DIGITS_FILE}.{os.getpid()}.tmp")
        with open(tmp, "wb") as out:
            np.savez(out, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
        os.replace(tmp, os.path.join(cache, DIGITS_FILE))
    return arrays


def summary(arrays: Arrays) -> dict[str, Any]:
    (x_train, _), (x_test, _) = arrays
    return {"train": int(x_train.shape[0]), "test": int(x_test.shape[0])}
