"""ImageNet base networks: weight files through the manifests, key names, trunk/classifier split, top-1."""
import numpy as np
import pytest
import torch

from docs_figures import REPO, table_cell
from stimsim.models.base_networks import (BASE_NETWORKS, base_network_spec, efficientnet_keys_to_timm, imagenet_logits,
                                          load_base_network)
from stimsim.training.imagenet import imagenet_files, imagenet_top1
from stimsim.utilities.errors import DataError, FileFormatError


def test_efficientnet_keys_are_renamed_to_timm_stages():
    value = torch.zeros(1)
    renamed = efficientnet_keys_to_timm({key: value for key in (
        "_conv_stem.weight", "_bn0.running_var", "_blocks.0._depthwise_conv.weight", "_blocks.0._bn2.bias",
        "_blocks.1._expand_conv.weight", "_blocks.3._bn0.weight", "_blocks.10._bn1.weight",
        "_blocks.15._project_conv.weight", "_conv_head.weight", "_bn1.bias", "_fc.weight")})
    # Tan & Le 2019 table 1: stages of 1, 2, 2, 3, 3, 4, 1 blocks; block 3 opens stage 2, 10 is stage 4's third
    assert list(renamed) == [
        "conv_stem.weight", "bn1.running_var", "blocks.0.0.conv_dw.weight", "blocks.0.0.bn2.bias",
        "blocks.1.0.conv_pw.weight", "blocks.2.0.bn1.weight", "blocks.4.2.bn2.weight",
        "blocks.6.0.conv_pwl.weight", "conv_head.weight", "bn2.bias", "classifier.weight"]
    with pytest.raises(ValueError, match="'_blocks.16._bn0.weight'"):
        efficientnet_keys_to_timm({"_blocks.16._bn0.weight": value})
    with pytest.raises(ValueError, match="'features.0.weight'"):
        efficientnet_keys_to_timm({"features.0.weight": value})


@pytest.mark.parametrize("name", sorted(BASE_NETWORKS))
def test_trunk_pool_classifier_reproduce_the_network(name, one_torch_thread):
    spec = base_network_spec(name)
    torch.manual_seed(0)
    network = load_base_network(name, pretrained=False)
    trunk, classifier = spec.split(network)
    x = torch.randn(2, 3, 64, 64)
    with torch.inference_mode():
        assert trunk(x).shape == (2, spec.feature_channels, 2, 2)
        torch.testing.assert_close(imagenet_logits(trunk, classifier, x), network(x))


def test_weights_of_another_network_are_refused(tmp_path, monkeypatch):
    path = tmp_path / "mobilenet.pth"
    torch.save({"features.0.0.weight": torch.zeros(1)}, path)
    monkeypatch.setattr("stimsim.models.base_networks.base_weights_path", lambda name, mirror=None: path)
    with pytest.raises(FileFormatError, match="not efficientnet_lite0 weights: key 'features.0.0.weight'"):
        load_base_network("efficientnet_lite0")


def test_imagenet_class_order_and_top1_of_a_constant_guess(shared_data):
    folder = shared_data("natural/imagenet_samples")
    files, classes = imagenet_files(folder)
    assert len(files) == 1000 and sorted(classes.tolist()) == list(range(1000))
    # ImageNet-1k's first and last classes in wnid order: tench and toilet tissue
    assert files[0].name.startswith("n01440764_") and files[-1].name.startswith("n15075141_")
    assert imagenet_top1(lambda images: np.eye(1000)[[0] * len(images)], folder, limit=60) == \
        {"top1": 1 / 60, "n": 60, "chance": 0.001}
    # split by what a model held out: the first file (class 0, guessed right) and the 11th (class 10, wrong)
    split = imagenet_top1(lambda images: np.eye(1000)[[0] * len(images)], folder, limit=20,
                          held_out={files[0].name, files[10].name, "word/word-47.jpg"})
    assert split["held_out"] == {"top1": 0.5, "n": 2} and split["trained_on"] == {"top1": 0.0, "n": 18}
    with pytest.raises(DataError, match="no ImageNet images"):
        imagenet_top1(lambda images: None, folder.parent / "floc")
    for limit in (1001, 0, 2.5, True):  # more than the samples hold was scored on the 1,000 without a word
        with pytest.raises(ValueError, match=rf"limit = {limit!r}: the number of ImageNet images to score must be an "
                                             r"integer from 1 to the 1000 in .*, or None for all"):
            imagenet_top1(lambda images: None, folder, limit=limit)


def _base_network_top1(name, base_network, folder, limit):
    network, preprocessing = base_network(name), base_network_spec(name).preprocessing

    def predict(images):
        with torch.inference_mode():
            return network(preprocessing(images)).numpy()

    return imagenet_top1(predict, folder, limit=limit)


@pytest.mark.parametrize("name", sorted(BASE_NETWORKS))
def test_imagenet_top1_on_the_first_samples(name, shared_data, base_network, one_torch_thread):
    """Published ImageNet validation top-1: MobileNetV2 71.9 %, EfficientNet-Lite0 74.9 %; the samples are
    easier (one clear photograph per class)."""
    result = _base_network_top1(name, base_network, shared_data("natural/imagenet_samples"), limit=100)
    assert result["n"] == 100 and result["top1"] >= 0.7


@pytest.mark.slow
@pytest.mark.every_model
@pytest.mark.parametrize("name", sorted(BASE_NETWORKS))
def test_imagenet_top1_on_all_samples_is_the_figure_of_the_docs(name, shared_data, base_network, one_torch_thread):
    """The base networks' top-1 on all 1,000 samples, as docs/data.md's table gives it (a few minutes each)."""
    result = _base_network_top1(name, base_network, shared_data("natural/imagenet_samples"), limit=None)
    assert result["n"] == 1000
    assert [result["top1"]] == pytest.approx(table_cell(REPO / "docs" / "data.md", f"`{name}`",
                                                        "ImageNet top-1, 1,000 samples"), abs=5e-4)
