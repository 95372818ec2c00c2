"""Models built from terraformer's layers."""
from terraformer.models.scaling_transformer import ScalingTransformer
from terraformer.models.scaling_transformer import ScalingTransformerLM
from terraformer.models.terraformer import Terraformer
