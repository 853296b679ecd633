"""Built-in sets, bundled with scikit-learn (no download): digits, breast_cancer, wine, synthetic.

Importing this module registers their loaders; scikit-learn is imported when one is called.
"""

from __future__ import annotations

from dpsweep.errors import ConfigError
from workers.datasets.descriptors import SYNTHETIC
from workers.datasets.records import DatasetSpec, RawData
from workers.datasets.registry import register_dataset


@register_dataset("digits")
def _digits(spec: DatasetSpec) -> RawData:
    from sklearn.datasets import load_digits

    d = load_digits()
    # 8x8 images with intensities 0..16 (a property of the data set's format).
    return RawData(x=d.images, y=d.target, kind="image", pixel_max=16.0)


@register_dataset("breast_cancer")
def _breast_cancer(spec: DatasetSpec) -> RawData:
    from sklearn.datasets import load_breast_cancer

    d = load_breast_cancer()
    return RawData(x=d.data, y=d.target, kind="tabular")


@register_dataset("wine")
def _wine(spec: DatasetSpec) -> RawData:
    from sklearn.datasets import load_wine

    d = load_wine()
    return RawData(x=d.data, y=d.target, kind="tabular")


# The options and their defaults are the descriptor's (workers.datasets.descriptors.SYNTHETIC):
# one declaration for submission's check and for the loader.
_SYNTHETIC_DEFAULTS: dict[str, int] = {
    name: int(option.default) for name, option in SYNTHETIC.options.items()
}


@register_dataset("synthetic")
def _synthetic(spec: DatasetSpec) -> RawData:
    from sklearn.datasets import make_classification

    unknown = set(spec.options) - set(_SYNTHETIC_DEFAULTS)
    if unknown:
        raise ConfigError(
            f"unknown option(s) {sorted(unknown)} for dataset 'synthetic'; "
            f"allowed: {sorted(_SYNTHETIC_DEFAULTS)}",
            field="dataset.options",
        )
    o = {**_SYNTHETIC_DEFAULTS, **spec.options}
    try:
        x, y = make_classification(
            n_samples=int(o["n_samples"]),
            n_features=int(o["n_features"]),
            n_informative=int(o["n_informative"]),
            n_redundant=0,
            n_classes=int(o["n_classes"]),
            random_state=int(o["seed"]),
        )
    except ValueError as exc:
        raise ConfigError(f"invalid options for dataset 'synthetic': {exc}") from exc
    return RawData(x=x, y=y, kind="tabular")
