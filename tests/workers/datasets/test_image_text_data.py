"""Data for image and text models: NPZ images in either layout, image folders, text CSV.

Real files written here (NPZ, PNG through Pillow, CSV, vocabularies, a tokenizer.json trained
on public text written by the test), loaded through :func:`load_dataset` as a sweep does.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from dpsweep.errors import ConfigError, DatasetError
from workers.datasets.descriptors import get_dataset_descriptor
from workers.datasets.loading import dataset_content_sha256, load_dataset
from workers.datasets.records import DatasetSpec
from workers.datasets.text import UNKNOWN_ID, simple_tokens


def _images(n: int = 40, c: int = 3, h: int = 5, w: int = 7, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, c, h, w), dtype=np.uint8)


def _labels(n: int = 40) -> np.ndarray:
    return np.arange(n) % 2


# ---------------------------------------------------------------------------------------------
# NPZ images: NCHW and NHWC


@pytest.mark.parametrize("c", [1, 3])
def test_nchw_and_nhwc_uint8_npz_load_to_identical_records(tmp_path: Path, c: int) -> None:
    x = _images(c=c)
    np.savez(tmp_path / "nchw.npz", x=x, y=_labels())
    np.savez(tmp_path / "nhwc.npz", x=x.transpose(0, 2, 3, 1), y=_labels())
    first = load_dataset(DatasetSpec("npz", path=str(tmp_path / "nchw.npz")))
    for options in ({}, {"layout": "nhwc"}):
        other = load_dataset(DatasetSpec("npz", path=str(tmp_path / "nhwc.npz"), options=options))
        assert other.input_shape == first.input_shape == (c, 5, 7)
        np.testing.assert_array_equal(other.x_train, first.x_train)
        np.testing.assert_array_equal(other.x_test, first.x_test)
        assert other.content_sha256 == first.content_sha256
    # uint8 is scaled by the format's fixed range, never by the records.
    assert first.input_scaling == {
        "method": "pixel",
        "clip": [0.0, 1.0],
        "source": "file format",
        "pixel_max": 255.0,
    }
    assert first.x_train.dtype == np.float32
    np.testing.assert_allclose(first.x_train.max(), x.max() / 255.0, rtol=1e-6)


def test_an_explicit_layout_overrides_the_guess(tmp_path: Path) -> None:
    # [N, 3, 4, 3]: both axes could be channels; auto keeps channels first, as before.
    x = _images(c=3, h=4, w=3)
    np.savez(tmp_path / "d.npz", x=x, y=_labels())
    auto = load_dataset(DatasetSpec("npz", path=str(tmp_path / "d.npz")))
    nhwc = load_dataset(
        DatasetSpec("npz", path=str(tmp_path / "d.npz"), options={"layout": "nhwc"})
    )
    assert auto.input_shape == (3, 4, 3) and nhwc.input_shape == (3, 3, 4)
    np.savez(tmp_path / "flat.npz", x=np.ones((40, 6)), y=_labels())
    with pytest.raises(ConfigError, match="layout nhwc applies to 4-D") as exc:
        load_dataset(
            DatasetSpec("npz", path=str(tmp_path / "flat.npz"), options={"layout": "nhwc"})
        )
    assert exc.value.field == "dataset.options.layout"


def test_float_npz_without_bounds_follows_the_privacy_rules(tmp_path: Path) -> None:
    x = _images().astype(np.float32) / 255.0
    x[0, 0, 0, 0] = 1e30  # one extreme training or evaluation value moves nothing much
    np.savez(tmp_path / "f.npz", x=x.transpose(0, 2, 3, 1), y=_labels())
    path = str(tmp_path / "f.npz")
    # carve-out: a robust range from the public evaluation split only, clipped to [0, 1].
    data = load_dataset(DatasetSpec("npz", path=path))
    assert data.input_scaling["method"] == "public-robust"
    assert data.input_scaling["source"] == "public evaluation split"
    for part in (data.x_train, data.x_test):
        assert np.isfinite(part).all() and part.min() >= 0 and part.max() <= 1
    # dp: the evaluation records are private, so no statistic may scale: bounds are needed.
    with pytest.raises(ConfigError, match="input_bounds") as exc:
        load_dataset(DatasetSpec("npz", path=path, evaluation="dp"))
    assert exc.value.field == "dataset.input_bounds"
    declared = load_dataset(DatasetSpec("npz", path=path, evaluation="dp", input_bounds=(0, 1)))
    assert declared.input_scaling["method"] == "declared" and declared.input_shape == (3, 5, 7)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_in_a_float_npz_are_refused(tmp_path: Path, bad: float) -> None:
    x = _images().astype(np.float64).transpose(0, 2, 3, 1)
    x[3, 1, 2, 0] = bad
    np.savez(tmp_path / "bad.npz", x=x, y=_labels())
    with pytest.raises(DatasetError, match=r"non-finite input value.*row 3"):
        load_dataset(DatasetSpec("npz", path=str(tmp_path / "bad.npz")))


# ---------------------------------------------------------------------------------------------
# Image folders


def _write_folder(root: Path, x: np.ndarray, labels: list[str], *, names: list[str]) -> None:
    for image, label, name in zip(x, labels, names, strict=True):
        (root / label).mkdir(parents=True, exist_ok=True)
        array = image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)
        Image.fromarray(array).save(root / label / name)


def test_an_image_folder_loads_with_the_folder_names_as_labels(tmp_path: Path) -> None:
    x = _images(n=24, c=3)
    labels = ["cat" if i % 3 else "dog" for i in range(24)]
    _write_folder(tmp_path / "a", x, labels, names=[f"{i:02d}.png" for i in range(24)])
    data = load_dataset(DatasetSpec("image_folder", path=str(tmp_path / "a"), test_fraction=0.25))
    assert data.kind == "image" and data.classes == ["cat", "dog"]
    assert data.input_shape == (3, 5, 7) and data.input_scaling["method"] == "pixel"
    # The records are the files' pixels (PNG is lossless), each with its folder's label.
    npz = tmp_path / "same.npz"
    order = sorted(range(24), key=lambda i: (labels[i], i))  # the folder's order
    np.savez(npz, x=x[order], y=np.asarray(labels)[order])
    same = load_dataset(DatasetSpec("npz", path=str(npz), test_fraction=0.25))
    np.testing.assert_array_equal(data.x_train, same.x_train)
    np.testing.assert_array_equal(data.y_train, same.y_train)
    assert data.content_sha256 == same.content_sha256
    # Grey on request: one channel.
    grey = load_dataset(
        DatasetSpec("image_folder", path=str(tmp_path / "a"), options={"mode": "grayscale"})
    )
    assert grey.input_shape == (1, 5, 7)


def test_an_image_folders_identity_is_order_and_name_free(tmp_path: Path) -> None:
    x = _images(n=20, c=1)
    labels = [str(i % 2) for i in range(20)]
    _write_folder(tmp_path / "a", x, labels, names=[f"{i:02d}.png" for i in range(20)])
    # The same images under other names, so listed in another order.
    order = list(range(20))
    random.Random(1).shuffle(order)
    _write_folder(
        tmp_path / "b",
        x[order],
        [labels[i] for i in order],
        names=[f"img_{j:02d}.png" for j in range(20)],
    )
    a = dataset_content_sha256(DatasetSpec("image_folder", path=str(tmp_path / "a")))
    b = dataset_content_sha256(DatasetSpec("image_folder", path=str(tmp_path / "b")))
    assert a == b
    assert load_dataset(DatasetSpec("image_folder", path=str(tmp_path / "a"))).input_shape == (
        1,
        5,
        7,
    )  # grey PNGs: mode auto gives one channel
    # Another pixel is other records.
    other = x.copy()
    other[0, 0, 0, 0] ^= 1
    _write_folder(tmp_path / "c", other, labels, names=[f"{i:02d}.png" for i in range(20)])
    assert dataset_content_sha256(DatasetSpec("image_folder", path=str(tmp_path / "c"))) != a


def test_an_image_of_another_size_is_refused_naming_the_file(tmp_path: Path) -> None:
    x = _images(n=10, c=3)
    _write_folder(
        tmp_path / "a", x, [str(i % 2) for i in range(10)], names=[f"{i}.png" for i in range(10)]
    )
    odd = np.full((6, 7, 3), 123, dtype=np.uint8)
    Image.fromarray(odd).save(tmp_path / "a" / "1" / "odd.png")
    with pytest.raises(DatasetError, match=r"odd\.png: 6x7 pixels") as exc:
        load_dataset(DatasetSpec("image_folder", path=str(tmp_path / "a")))
    assert "123" not in str(exc.value)  # sizes and names, never a pixel value
    declared = {"size": [5, 7]}
    declared_size = r"odd\.png: 6x7 pixels \(HxW\), not the declared size 5x7"
    with pytest.raises(DatasetError, match=declared_size):
        load_dataset(DatasetSpec("image_folder", path=str(tmp_path / "a"), options=declared))
    resized = load_dataset(
        DatasetSpec(
            "image_folder", path=str(tmp_path / "a"), options={**declared, "resize": "bilinear"}
        )
    )
    assert resized.n_private == 11 and resized.input_shape == (3, 5, 7)
    with pytest.raises(ConfigError, match="needs the size") as exc2:
        load_dataset(
            DatasetSpec("image_folder", path=str(tmp_path / "a"), options={"resize": "nearest"})
        )
    assert exc2.value.field == "dataset.options.size"


def test_a_malformed_image_folder_is_refused_naming_what(tmp_path: Path) -> None:
    root = tmp_path / "a"
    _write_folder(root, _images(n=6, c=1), ["x", "y"] * 3, names=[f"{i}.png" for i in range(6)])
    (root / "y" / "notes.txt").write_text("hello")
    with pytest.raises(DatasetError, match=r"notes\.txt: not an image file"):
        load_dataset(DatasetSpec("image_folder", path=str(root)))
    (root / "y" / "notes.txt").unlink()
    (root / "y" / "broken.png").write_bytes(b"not a png")
    with pytest.raises(DatasetError, match=r"broken\.png: not a readable image"):
        load_dataset(DatasetSpec("image_folder", path=str(root)))
    shutil.rmtree(root / "y")
    with pytest.raises(DatasetError, match="at least two"):
        load_dataset(DatasetSpec("image_folder", path=str(root)))
    (root / "z").mkdir()
    with pytest.raises(DatasetError, match="holds no image"):
        load_dataset(DatasetSpec("image_folder", path=str(root)))
    with pytest.raises(DatasetError, match="not a folder"):
        load_dataset(DatasetSpec("image_folder", path=str(tmp_path / "missing")))


def test_mode_auto_refuses_grey_and_colour_images_mixed(tmp_path: Path) -> None:
    # One record must not silently change the input shape (1 or 3 channels), which is public.
    root = tmp_path / "a"
    _write_folder(root, _images(n=6, c=1), ["x", "y"] * 3, names=[f"{i}.png" for i in range(6)])
    Image.fromarray(_images(n=1, c=3)[0].transpose(1, 2, 0)).save(root / "y" / "colour.png")
    with pytest.raises(DatasetError, match=r"colour images \(e\.g\. .*colour\.png\) are mixed"):
        load_dataset(DatasetSpec("image_folder", path=str(root)))
    for mode, channels in (("grayscale", 1), ("rgb", 3)):
        spec = DatasetSpec("image_folder", path=str(root), options={"mode": mode})
        assert load_dataset(spec).input_shape == (channels, 5, 7)


def test_16_bit_images_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "a"
    _write_folder(root, _images(n=4, c=1), ["x", "y"] * 2, names=[f"{i}.png" for i in range(4)])
    Image.fromarray(np.full((5, 7), 40000, dtype=np.uint16)).save(root / "x" / "wide.png")
    with pytest.raises(DatasetError, match=r"wide\.png: 16-bit"):
        load_dataset(DatasetSpec("image_folder", path=str(root)))


# ---------------------------------------------------------------------------------------------
# Text CSV

TEXTS = [
    ("A great film, truly great!", "pos"),
    ("terrible plot and bad acting", "neg"),
    ("great acting", "pos"),
    ("bad bad bad film", "neg"),
]


def _text_csv(path: Path, n: int = 40, extra: str = "") -> Path:
    rows = [f'"{TEXTS[i % 4][0]}{extra}",{TEXTS[i % 4][1]},{i}' for i in range(n)]
    path.write_text("text,label,id\n" + "\n".join(rows) + "\n")
    return path


def _text_spec(path: Path, **options: Any) -> DatasetSpec:
    return DatasetSpec("text_csv", path=str(path), label_column="label", options=options)


def test_a_public_vocabulary_tokenizes_pads_truncates_and_marks_unknown_words(
    tmp_path: Path,
) -> None:
    data = _text_csv(tmp_path / "t.csv")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("great\nbad\nfilm\n\n,\nGreat\n")  # blank and duplicate lines skipped
    # ids: great 2, bad 3, film 4, "," 5; pad 0, unknown 1.
    loaded = load_dataset(_text_spec(data, vocab=str(vocab), max_length=6))
    assert loaded.kind == "tokens" and loaded.input_shape == (6,) and loaded.vocab_size == 6
    assert loaded.x_train.dtype == np.int64 and loaded.classes == ["neg", "pos"]
    assert loaded.input_scaling["method"] == "tokens" and loaded.input_scaling["clip"] == [0, 5]
    rows = {tuple(r) for r in np.concatenate([loaded.x_train, loaded.x_test]).tolist()}
    assert rows == {
        (1, 2, 4, 5, 1, 2),  # "a great film , truly great" (cut at 6; "!" is cut off)
        (1, 1, 1, 3, 1, 0),  # "terrible plot and bad acting" + pad
        (2, 1, 0, 0, 0, 0),  # "great acting"
        (3, 3, 3, 4, 0, 0),  # "bad bad bad film"
    }
    assert simple_tokens("Hello, World!") == ["hello", ",", "world", "!"]


def test_a_tokenizer_json_trained_on_public_text_tokenizes(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    # Public text written by the test: the tokenizer never sees the dataset's records.
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.WordLevelTrainer(special_tokens=["[UNK]"])
    tok.train_from_iterator(["great film", "bad plot", "the end"], trainer=trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    data = _text_csv(tmp_path / "t.csv")
    loaded = load_dataset(
        _text_spec(data, tokenizer=str(tmp_path / "tokenizer.json"), max_length=5)
    )
    assert loaded.vocab_size == tok.get_vocab_size() + 2 and loaded.input_shape == (5,)
    ids = {t: i + 2 for t, i in tok.get_vocab().items()}
    rows = {tuple(r) for r in np.concatenate([loaded.x_train, loaded.x_test]).tolist()}
    # The tokenizer's own [UNK] becomes 1; its words are its ids + 2; 0 pads.
    assert (ids["great"], UNKNOWN_ID, 0, 0, 0) in rows  # "great acting"
    assert (UNKNOWN_ID, ids["plot"], UNKNOWN_ID, ids["bad"], UNKNOWN_ID) in rows
    # Text records are the same records whatever public tokenizer reads them.
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("great\n")
    assert loaded.content_sha256 == load_dataset(_text_spec(data, vocab=str(vocab))).content_sha256


def test_no_option_builds_a_vocabulary_from_the_records(tmp_path: Path) -> None:
    data = _text_csv(tmp_path / "t.csv")
    descriptor = get_dataset_descriptor("text_csv")
    # Every option is a column, a public file, or a length: none selects a built vocabulary.
    assert {n: o.kind for n, o in descriptor.options.items()} == {
        "text_column": "text",
        "vocab": "path",
        "tokenizer": "path",
        "max_length": "int",
    }
    assert set(descriptor.path_options()) == {"vocab", "tokenizer"}
    # Without a public tokenizer, every combination of the other options is refused.
    for options in ({}, {"max_length": 4}, {"text_column": "text", "max_length": 300}):
        with pytest.raises(ConfigError, match="never built from the records") as exc:
            load_dataset(_text_spec(data, **options))
        assert exc.value.field == "dataset.options.vocab"
    # The data file itself is not a vocabulary (its lines would become the tokens).
    for option in ("vocab", "tokenizer"):
        with pytest.raises(ConfigError, match="the data file itself") as exc:
            load_dataset(_text_spec(data, **{option: str(data)}))
        assert exc.value.field == f"dataset.options.{option}"
    # A word frequent in the records but absent from the public vocabulary stays unknown,
    # and the vocabulary's size is the file's, whatever the records hold.
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("great\n")
    loaded = load_dataset(_text_spec(data, vocab=str(vocab)))
    assert loaded.vocab_size == 3
    assert set(np.unique(loaded.x_train).tolist()) <= {0, 1, 2}
    both = {"vocab": str(vocab), "tokenizer": str(vocab)}
    with pytest.raises(ConfigError, match="exactly one"):
        load_dataset(_text_spec(data, **both))


def test_text_csv_errors_name_lines_never_texts(tmp_path: Path) -> None:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("great\n")
    path = tmp_path / "t.csv"
    path.write_text('text,label\n"secret words here",pos\n"more secret words",\n')
    with pytest.raises(DatasetError, match="line 3: missing label") as exc:
        load_dataset(_text_spec(path, vocab=str(vocab)))
    assert "secret" not in str(exc.value)
    with pytest.raises(DatasetError, match="no column named 'body'"):
        load_dataset(_text_spec(path, vocab=str(vocab), text_column="body"))
    with pytest.raises(DatasetError, match="file not found"):
        load_dataset(_text_spec(path, vocab=str(tmp_path / "missing.txt")))


def test_text_records_split_by_content_in_mode_dp(tmp_path: Path) -> None:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("great\nbad\n")
    path = tmp_path / "t.csv"
    rows = [f"text number {i} great,{'pos' if i % 2 else 'neg'}" for i in range(60)]
    path.write_text("text,label\n" + "\n".join(rows) + "\n")
    spec = DatasetSpec(
        "text_csv",
        path=str(path),
        label_column="label",
        options={"vocab": str(vocab)},
        evaluation="dp",
    )
    a = load_dataset(spec)
    assert a.evaluation == "dp" and a.n_private == 60 and 0 < len(a.x_test) < 60
    # Removing one record moves no other across the split.
    path.write_text("text,label\n" + "\n".join(rows[1:]) + "\n")
    b = load_dataset(spec)
    assert len(a.x_test) - len(b.x_test) in (0, 1)
    assert len(a.x_train) + len(a.x_test) - len(b.x_train) - len(b.x_test) == 1


def test_a_public_evaluation_text_dataset_must_share_the_tokenizer(tmp_path: Path) -> None:
    vocab, other = tmp_path / "vocab.txt", tmp_path / "other.txt"
    vocab.write_text("great\nbad\n")
    other.write_text("bad\ngreat\n")  # the same words, other ids
    private = _text_csv(tmp_path / "private.csv")
    public = _text_csv(tmp_path / "public.csv", n=8, extra=" again")

    def spec(eval_vocab: Path, length: int = 16) -> DatasetSpec:
        evaluation = _text_spec(public, vocab=str(eval_vocab), max_length=length)
        return DatasetSpec(
            "text_csv",
            path=str(private),
            label_column="label",
            options={"vocab": str(vocab), "max_length": 16},
            evaluation="public",
            eval_dataset=evaluation,
        )

    data = load_dataset(spec(vocab))
    assert data.x_test.dtype == np.int64 and len(data.x_test) == 8 and data.n_private == 40
    for bad in (spec(other), spec(vocab, length=8)):
        with pytest.raises(ConfigError, match="another tokenizer") as exc:
            load_dataset(bad)
        assert exc.value.field == "eval.dataset"
