"""Data: manifests of datasets and checkpoints (cache, mirrors, checksums) and stimulus sets."""
from stimsim.data.manifest import (
    ManifestEntry,
    ManifestFile,
    ManifestSource,
    cache_dir,
    entry_path,
    entry_paths,
    fetch,
    get_entry,
    load_manifests,
    manifest_dir,
    mirror_dir,
    remove_cached,
    verification_passed,
    verify,
    verify_all,
)
from stimsim.data.stimuli import (
    FASHION_MNIST_CLASSES,
    FLOC_CATEGORIES,
    FLOC_DOMAINS,
    MOELLER2017_FOLDERS,
    StimulusSet,
    fashion_mnist,
    floc,
    from_folder,
    from_table,
    imagenet_samples,
    lfw_subset,
    moeller2017,
    pixel_noise,
)

__all__ = [
    "ManifestEntry", "ManifestFile", "ManifestSource", "cache_dir", "entry_path", "entry_paths", "fetch",
    "get_entry", "load_manifests", "manifest_dir", "mirror_dir", "remove_cached", "verification_passed",
    "verify", "verify_all",
    "FASHION_MNIST_CLASSES", "FLOC_CATEGORIES", "FLOC_DOMAINS", "MOELLER2017_FOLDERS", "StimulusSet",
    "fashion_mnist", "floc", "from_folder", "from_table", "imagenet_samples", "lfw_subset", "moeller2017",
    "pixel_noise",
]
