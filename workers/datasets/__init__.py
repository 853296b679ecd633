"""Datasets: built-in sets, loaders for files a user already has, and their descriptors.

Every loader returns raw arrays; :func:`load_dataset` then separates training from evaluation
records (by ``DatasetSpec.evaluation``) and normalises the inputs. The package, by concept:

* :mod:`~workers.datasets.descriptors`: what each dataset is (name, input kind, options with
  their ranges), torch- and numpy-free, for submission and planning;
* :mod:`~workers.datasets.records`: the spec of what to load, a loader's raw arrays, the result;
* :mod:`~workers.datasets.registry`: the loaders by name (plug-ins: ``dpsweep.datasets``);
* :mod:`~workers.datasets.builtin`: the sets bundled with scikit-learn;
* :mod:`~workers.datasets.people`: ``mnist1d-people``, MNIST-1D grouped into people (a
  built-in privacy unit);
* :mod:`~workers.datasets.unit_values`: privacy units as loaders read them;
* :mod:`~workers.datasets.formats`: IDX, NPZ (images channels-first or -last) and CSV files;
* :mod:`~workers.datasets.images`: image folders (``root/<label>/<image>``, Pillow);
* :mod:`~workers.datasets.cifar`: CIFAR-10 and CIFAR-100 from their python batches (a
  restricted unpickler: a data file never runs code);
* :mod:`~workers.datasets.text`: text CSV files, tokenized by a public vocabulary or
  pretrained tokenizer (records of kind ``tokens``);
* :mod:`~workers.datasets.identity`: the content hash that keys a dataset's privacy ledger;
* :mod:`~workers.datasets.finite`: the refusal of NaN and inf;
* :mod:`~workers.datasets.splits`: the evaluation carve-outs (seeded, or keyed by content;
  by unit when the dataset declares a privacy unit);
* :mod:`~workers.datasets.scaling`: normalisation by rules that use no training record;
* :mod:`~workers.datasets.loading`: :func:`load_dataset`, the evaluation modes' privacy notes.

Importing this package needs numpy (scikit-learn only when a built-in set is loaded, Pillow
when an image folder is, tokenizers when a tokenizer.json is), never torch.
"""

from __future__ import annotations

# Imported for their registrations: the built-in loaders and the file formats.
from workers.datasets import builtin, cifar, formats, images, people, text  # noqa: F401
from workers.datasets.descriptors import (
    DATASET_DESCRIPTORS,
    INPUT_KINDS,
    DatasetDescriptor,
    dataset_descriptor_names,
    get_dataset_descriptor,
    register_dataset_descriptor,
)
from workers.datasets.formats import read_idx
from workers.datasets.identity import content_sha256
from workers.datasets.loading import dataset_content_sha256, load_dataset
from workers.datasets.records import EVAL_MODES, Dataset, DatasetSpec, Kind, RawData
from workers.datasets.registry import (
    DATASETS,
    Loader,
    dataset_names,
    has_loader,
    register_dataset,
)

__all__ = [
    "DATASETS",
    "DATASET_DESCRIPTORS",
    "EVAL_MODES",
    "INPUT_KINDS",
    "Dataset",
    "DatasetDescriptor",
    "DatasetSpec",
    "Kind",
    "Loader",
    "RawData",
    "content_sha256",
    "dataset_content_sha256",
    "dataset_descriptor_names",
    "dataset_names",
    "get_dataset_descriptor",
    "has_loader",
    "load_dataset",
    "read_idx",
    "register_dataset",
    "register_dataset_descriptor",
]
