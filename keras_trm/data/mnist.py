"""MNIST handwritten digits (LeCun et al. 1998) from the original IDX files.

Local files (``keras_trm.data.paths``; provenance in
``shared/data/README.md``): ``<data_dir>/mnist/{train,t10k}-images-idx3-ubyte.gz``
and ``...-labels-idx1-ubyte.gz`` (60,000 and 10,000 digits). IDX format: a
big-endian int32 header -- magic number (2051 images, 2049 labels), item
count, then (images only) rows and columns -- and the raw ``uint8`` data,
row major. Online, the same data come from tfds ``mnist``.
"""

import gzip
import zlib

import numpy as np

from keras_trm.data.paths import resolve_data_dir
from keras_trm.data.translation import CorpusError
from keras_trm.utils import checks as v

MNIST_SPLITS = {"train": "train", "test": "t10k"}
IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049
IMAGE_SIZE = 28


def _read_idx(path, magic, ndim):
    """Reads an IDX file with ``ndim`` dimensions, checking magic and size."""
    try:
        with (gzip.open if str(path).endswith(".gz") else open)(path, "rb") as f:
            data = f.read()
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise CorpusError(f"{path} is not a readable gzip file (cut short or "
                          f"not gzip: copy it again): {err}") from None
    header_size = 4 * (1 + ndim)
    what = "images" if magic == IMAGES_MAGIC else "labels"
    if len(data) < header_size:
        raise ValueError(f"{path}: {len(data)} bytes, too short for an IDX header of "
                         f"{header_size} bytes")
    header = np.frombuffer(data, dtype=">i4", count=1 + ndim)
    if int(header[0]) != magic:
        raise ValueError(f"{path}: IDX magic number {int(header[0])}, expected {magic} "
                         f"({what})")
    shape = tuple(int(d) for d in header[1:])
    expected = int(np.prod(shape))
    if len(data) - header_size != expected:
        raise ValueError(f"{path}: header says shape {shape} ({expected} bytes of data) "
                         f"but the file has {len(data) - header_size} bytes after the "
                         "header")
    if not shape[0]:
        raise CorpusError(f"{path}: the IDX header says it holds no {what}")
    array = np.frombuffer(data, dtype=np.uint8, offset=header_size)
    return array.reshape(shape).copy()  # writable, independent of `data`


def _load_tfds(split, root):
    import tensorflow_datasets as tfds

    ds = tfds.as_numpy(tfds.load("mnist", split=split, batch_size=-1,
                                 data_dir=str(root / "tensorflow_datasets")))
    return (ds["image"].reshape(-1, IMAGE_SIZE, IMAGE_SIZE).astype(np.uint8),
            ds["label"].astype(np.uint8))


def load_mnist(split="train", data_dir=None, download=False):
    """Loads one split of MNIST as ``(images, labels)``.

    Args:
        split: ``"train"`` (60,000 digits) or ``"test"`` (10,000, ``t10k``).
        data_dir: data directory (see ``resolve_data_dir``).
        download: if a local file is missing, load the split from tfds
            ``mnist`` (cached under ``<data_dir>/tensorflow_datasets``).

    Returns:
        ``(images, labels)``: ``np.uint8`` arrays ``(N, 28, 28)`` with pixel
        values 0-255 (0 = background) and ``(N,)`` with digits 0-9.

    Raises:
        ValueError: unknown ``split``; a wrong magic number, a size that
            disagrees with the header, images not 28x28, or image and label
            counts that differ (the file named).
        CorpusError: (a ``ValueError``) not a readable gzip file, or no
            digit (named).
        FileNotFoundError: a file is missing and not downloaded (the
            expected files and folder named).
    """
    v.one_of("split", split, tuple(MNIST_SPLITS))
    root = resolve_data_dir(data_dir, must_exist=not download)
    directory = root / "mnist"
    prefix = MNIST_SPLITS[split]
    names = (f"{prefix}-images-idx3-ubyte.gz", f"{prefix}-labels-idx1-ubyte.gz")
    missing = [n for n in names if not (directory / n).is_file()]
    if missing:
        if download:
            return _load_tfds(split, root)
        raise FileNotFoundError(
            f"MNIST split {split!r} not found: expected {names[0]} and "
            f"{names[1]} in {directory} (missing: {', '.join(missing)}; "
            "pass download=True, or --download true to keras-trm train-mnist, to "
            "use tfds 'mnist' when online)")
    images_path, labels_path = (directory / n for n in names)
    images = _read_idx(images_path, IMAGES_MAGIC, 3)
    labels = _read_idx(labels_path, LABELS_MAGIC, 1)
    if images.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE):
        raise ValueError(f"{images_path}: images are {images.shape[1]}x"
                         f"{images.shape[2]}, expected {IMAGE_SIZE}x{IMAGE_SIZE}")
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"MNIST {split}: {images_path} has {images.shape[0]} images "
                         f"but {labels_path} has {labels.shape[0]} labels")
    return images, labels
