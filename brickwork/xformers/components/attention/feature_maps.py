"""xformers' FAVOR feature-map names, over brickwork's orthogonal random features."""

from __future__ import annotations

from enum import Enum, auto

import torch
from torch import nn

from brickwork.components.attention.favor import orthogonal_features


class FeatureMapType(str, Enum):
    SMOrf = "sm_orf"
    SMHyp = "sm_hyp"
    SMReg = "sm_reg"


class NormDistribution(Enum):
    Xi = auto()
    Uniform = auto()


class _SoftMaxEstimator:
    """One FAVOR+ estimator family; brickwork's ``favor`` draws the features (``feature_map_type``)."""

    feature_map_type: FeatureMapType

    @staticmethod
    def _get_random_ortho_matrix(
        blocks: int,
        dim: int,
        device: torch.device,
        norm_distribution: NormDistribution = NormDistribution.Uniform,
    ) -> torch.Tensor:
        """``[blocks, dim, dim]`` blocks of orthogonal rows; row norms √dim (``Uniform``) or those of
        Gaussian vectors (``Xi``, chi-distributed)."""
        kind = "sm_reg" if norm_distribution == NormDistribution.Xi else "sm_orf"
        return orthogonal_features(blocks * dim, dim, kind).reshape(blocks, dim, dim).to(device)


class SMOrf(_SoftMaxEstimator):
    feature_map_type = FeatureMapType.SMOrf


class SMHyperbolic(_SoftMaxEstimator):
    feature_map_type = FeatureMapType.SMHyp


class SMReg(_SoftMaxEstimator):
    feature_map_type = FeatureMapType.SMReg


class FeatureMapView:
    """What xformers exposed as ``FavorAttention.feature_map``: ``features`` ``[D, m]``, a snapshot of the
    brickwork mechanism's current draw."""

    def __init__(self, mechanism: nn.Module) -> None:
        self._mechanism = mechanism

    @property
    def features(self) -> torch.Tensor:
        return self._mechanism.features.T.clone()


__all__ = ["FeatureMapType", "NormDistribution", "SMHyperbolic", "SMOrf", "SMReg"]
