"""Published datasets as plug-ins: one module per paper (loader through the data manifest, the
comparison it supports, its figure, its constants beside the methods they come from).

Registered: ``afraz2006`` (:mod:`stimsim.datasets.afraz2006`), ``moeller2017``
(:mod:`stimsim.datasets.moeller2017`); ``DATASETS.names()`` lists every registered one.
"""
from stimsim.datasets.base import DATASETS, PublishedDataset, get_dataset, register_dataset

__all__ = ["DATASETS", "PublishedDataset", "get_dataset", "register_dataset"]
