"""An image-text model around a supported language model (LFM2-VL: a SigLIP2 vision tower feeding LFM2's short-conv
and attention layers): ReplayCache decodes it, with an image in the prompt, as stock transformers does."""

from __future__ import annotations

import pytest
import torch
from conftest import max_logit_diff

from hf_replayssm import ReplayCache
from hf_replayssm.tiny import tiny_config

pytestmark = pytest.mark.equivalence
NEW = 12
PATCH, GRID = 4, 4  # 4 x 4 patches of 4 x 4 pixels: 4 image tokens after LFM2-VL's 2 x 2 pixel unshuffle


def _model():
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Lfm2VlForConditionalGeneration"):
        pytest.skip(f"transformers {transformers.__version__} has no lfm2_vl")
    text = tiny_config("lfm2", initializer_range=0.2).to_dict()
    vision = dict(model_type="siglip2_vision_model", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=64, patch_size=PATCH, num_patches=GRID * GRID)
    config = transformers.Lfm2VlConfig(text_config=text, vision_config=vision, projector_hidden_size=32,
                                       downsample_factor=2, image_token_id=text["vocab_size"] - 1)
    torch.manual_seed(0)
    return transformers.Lfm2VlForConditionalGeneration(config).eval()


def _image_prompt(model, rows: int, seed: int = 0):
    """Token ids with one image's placeholder tokens in the middle, and that image's patch inputs."""
    generator = torch.Generator().manual_seed(seed)
    image = model.config.image_token_id
    ids = torch.cat([torch.randint(3, image, (rows, 5), generator=generator),
                     torch.full((rows, GRID * GRID // 4), image),
                     torch.randint(3, image, (rows, 6), generator=generator)], dim=1)
    pixels = dict(pixel_values=torch.randn(rows, GRID * GRID, 3 * PATCH * PATCH, generator=generator),
                  spatial_shapes=torch.tensor([[GRID, GRID]] * rows),
                  pixel_attention_mask=torch.ones(rows, GRID * GRID, dtype=torch.long))
    return ids, pixels


def _greedy(model):
    return dict(do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW, output_logits=True,
                return_dict_in_generate=True, suppress_tokens=[0, model.config.image_token_id])


def test_image_prompt_decodes_like_stock():
    model = _model()
    ids, pixels = _image_prompt(model, rows=2)
    stock = model.generate(ids, **pixels, **_greedy(model))
    out = model.generate(ids, **pixels, past_key_values=ReplayCache(4), **_greedy(model))
    assert torch.equal(out.sequences, stock.sequences)
    assert max_logit_diff(out.logits, stock.logits) < 1e-4
    # the image mattered: other pixels, other logits
    _, other = _image_prompt(model, rows=2, seed=1)
    moved = model.generate(ids, **other, past_key_values=ReplayCache(4), **_greedy(model))
    assert max_logit_diff(moved.logits, out.logits) > 1e-3


def test_prompt_lookup_with_an_image_equals_greedy():
    model = _model()
    ids, pixels = _image_prompt(model, rows=1)
    ids = torch.cat([ids, ids[:, :5]], dim=1)  # text that repeats: prompt lookup finds drafts
    greedy = model.generate(ids, **pixels, **_greedy(model))
    cache = ReplayCache(4)
    out = model.generate(ids, **pixels, past_key_values=cache, prompt_lookup_num_tokens=3, **_greedy(model))
    assert torch.equal(out.sequences, greedy.sequences)
    assert max_logit_diff(out.logits, greedy.logits) < 1e-4
    assert cache.stats()["rolled_back_tokens"] > 0  # drafts were rejected and rolled back on the way


def test_batched_speculation_refuses_the_image_it_would_drop():
    """The batched route feeds the model token ids and a mask only: with images it would decode as if there were
    none, so it refuses and names them; plain batched decoding takes them."""
    model = _model()
    ids, pixels = _image_prompt(model, rows=2)
    with pytest.raises(ValueError, match="ignore pixel_attention_mask, pixel_values, spatial_shapes"):
        model.generate(ids, **pixels, past_key_values=ReplayCache(4), prompt_lookup_num_tokens=3, do_sample=False,
                       max_new_tokens=4)
    plain = model.generate(ids, **pixels, past_key_values=ReplayCache(4), do_sample=False, max_new_tokens=4)
    assert torch.equal(plain, model.generate(ids, **pixels, do_sample=False, max_new_tokens=4))
