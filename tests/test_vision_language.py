"""Image-text models around supported language models (LFM2-VL: a SigLIP2 vision tower feeding LFM2's short-conv and
attention layers; Qwen3.5: a vision tower feeding Gated DeltaNet and attention layers with multimodal rotary
positions; GLM-5-Next: KDA layers): ReplayCache decodes them, with an image in the prompt, as stock transformers
does."""

from __future__ import annotations

import pytest
import torch
from conftest import max_logit_diff

from hf_replayssm import ReplayCache
from hf_replayssm.tiny import tiny_config

pytestmark = pytest.mark.equivalence
NEW = 12
PATCH, GRID = 4, 4  # 4 x 4 patches of 4 x 4 pixels: 4 image tokens after LFM2-VL's 2 x 2 pixel unshuffle


def _lfm2_vl():
    """(model, prompt maker, special ids) for a tiny LFM2-VL."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Lfm2VlForConditionalGeneration"):
        pytest.skip(f"transformers {transformers.__version__} has no lfm2_vl")
    text = tiny_config("lfm2", initializer_range=0.2).to_dict()
    vision = dict(model_type="siglip2_vision_model", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=64, patch_size=PATCH, num_patches=GRID * GRID)
    config = transformers.Lfm2VlConfig(text_config=text, vision_config=vision, projector_hidden_size=32,
                                       downsample_factor=2, image_token_id=text["vocab_size"] - 1)
    torch.manual_seed(0)
    model = transformers.Lfm2VlForConditionalGeneration(config).eval()
    image = config.image_token_id

    def prompt(rows: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        ids = torch.cat([torch.randint(3, image, (rows, 5), generator=generator),
                         torch.full((rows, GRID * GRID // 4), image),
                         torch.randint(3, image, (rows, 6), generator=generator)], dim=1)
        pixels = dict(pixel_values=torch.randn(rows, GRID * GRID, 3 * PATCH * PATCH, generator=generator),
                      spatial_shapes=torch.tensor([[GRID, GRID]] * rows),
                      pixel_attention_mask=torch.ones(rows, GRID * GRID, dtype=torch.long))
        return ids, pixels

    return model, prompt, [image]


def _qwen3_5():
    """(model, prompt maker, special ids) for a tiny Qwen3.5 image-text model (Gated DeltaNet layers under a vision
    tower, multimodal rotary positions)."""
    transformers = pytest.importorskip("transformers")
    text = tiny_config("qwen3_5_text", initializer_range=0.2).to_dict()
    vocab = text["vocab_size"]
    image, start, end = vocab - 1, vocab - 3, vocab - 4
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, patch_size=PATCH,
                  temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=text["hidden_size"], in_channels=3,
                  num_position_embeddings=GRID * GRID)
    config = transformers.Qwen3_5Config(text_config=text, vision_config=vision, image_token_id=image,
                                        video_token_id=vocab - 2, vision_start_token_id=start, vision_end_token_id=end)
    torch.manual_seed(0)
    model = transformers.Qwen3_5ForConditionalGeneration(config).eval()
    return model, _grid_prompt(vocab - 5, image, start, end), [image, vocab - 2, start, end]


def _lfm3_vl():
    """(model, prompt maker, special ids) for a tiny LFM3-VL (its vision tower has short-conv layers of its own,
    which are not the language model's and must stay stock)."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Lfm3VlForConditionalGeneration"):
        pytest.skip(f"transformers {transformers.__version__} has no lfm3_vl")
    text = tiny_config("lfm3", initializer_range=0.2).to_dict()
    vocab = text["vocab_size"]
    image, start, end = vocab - 1, vocab - 3, vocab - 4
    vision = dict(hidden_size=32, intermediate_size=64, patch_size=PATCH, spatial_merge_size=2, temporal_patch_size=2,
                  num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                  layer_types=["conv", "full_attention"])
    config = transformers.Lfm3VlConfig(text_config=text, vision_config=vision, image_token_id=image,
                                       video_token_id=vocab - 2, vision_start_token_id=start, vision_end_token_id=end,
                                       projector_hidden_size=32)
    torch.manual_seed(0)
    model = transformers.Lfm3VlForConditionalGeneration(config).eval()
    return model, _grid_prompt(vocab - 5, image, start, end), [image, vocab - 2, start, end]


def _grid_prompt(top: int, image: int, start: int, end: int, patch: int = PATCH):
    """Prompts for towers that take flattened patches and a (t, h, w) grid per image (Qwen3.5, LFM3-VL, GLM-5-Next):
    text ids below ``top``, an image of ``patch``-pixel patches between its start and end tokens."""

    def prompt(rows: int, seed: int):
        assert rows == 1
        generator = torch.Generator().manual_seed(seed)
        ids = torch.cat([torch.randint(3, top, (1, 5), generator=generator), torch.tensor([[start]]),
                         torch.full((1, GRID * GRID // 4), image), torch.tensor([[end]]),
                         torch.randint(3, top, (1, 6), generator=generator)], dim=1)
        pixels = dict(pixel_values=torch.randn(GRID * GRID, 3 * 2 * patch * patch, generator=generator),
                      image_grid_thw=torch.tensor([[1, GRID, GRID]]))
        return ids, pixels

    return prompt


def _glm5_next():
    """(model, prompt maker, special ids) for the bundled tiny GLM-5-Next (KDA layers under a vision tower of 14-pixel
    patches); its indexer makes speculation refuse past 16 tokens, so it takes plain decoding only here."""
    from hf_replayssm.tiny import tiny_model

    model = tiny_model("glm5_next", initializer_range=0.2)
    config = model.config
    image, start, end = config.image_token_id, config.image_start_token_id, config.image_end_token_id
    return model, _grid_prompt(100, image, start, end, patch=14), list(range(image, image + 6))


MODELS = {"lfm2_vl": _lfm2_vl, "lfm3_vl": _lfm3_vl, "qwen3_5": _qwen3_5, "glm5_next": _glm5_next}
SPECULATING = sorted(set(MODELS) - {"glm5_next"})


def _greedy(special: list[int]):
    return dict(do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW, output_logits=True,
                return_dict_in_generate=True, suppress_tokens=[0, *special])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_image_prompt_decodes_like_stock(name):
    """Plain decoding, dynamic and static (compiled-path) caches, equal to stock; the image matters (other pixels give
    other logits)."""
    model, prompt, special = MODELS[name]()
    ids, pixels = prompt(1, 0)
    stock = model.generate(ids, **pixels, **_greedy(special))
    static = ReplayCache(4, max_cache_len=ids.shape[1] + NEW)
    if name.startswith("lfm"):  # short-conv layers have no device-position step: a static cache refuses them at bind
        with pytest.raises(ValueError, match="ShortConv"):
            model.generate(ids, **pixels, past_key_values=static, **_greedy(special))
        static = None
    for cache in (ReplayCache(4), static):
        if cache is None:
            continue
        out = model.generate(ids, **pixels, past_key_values=cache, **_greedy(special))
        assert torch.equal(out.sequences, stock.sequences)
        assert max_logit_diff(out.logits, stock.logits) < 1e-4
    _, other = prompt(1, 1)
    moved = model.generate(ids, **other, past_key_values=ReplayCache(4), **_greedy(special))
    assert max_logit_diff(moved.logits, stock.logits) > 1e-3


@pytest.mark.parametrize("name", SPECULATING)
def test_prompt_lookup_with_an_image_equals_greedy(name):
    model, prompt, special = MODELS[name]()
    ids, pixels = prompt(1, 0)
    ids = torch.cat([ids, ids[:, -6:], ids[:, -6:]], dim=1)  # text that repeats: prompt lookup finds drafts
    greedy = model.generate(ids, **pixels, **_greedy(special))
    cache = ReplayCache(4)
    out = model.generate(ids, **pixels, past_key_values=cache, prompt_lookup_num_tokens=3, **_greedy(special))
    assert torch.equal(out.sequences, greedy.sequences)
    assert max_logit_diff(out.logits, greedy.logits) < 1e-4
    assert cache.stats()["rolled_back_tokens"] > 0  # drafts were rejected and rolled back on the way


def test_batched_speculation_refuses_the_image_it_would_drop():
    """The batched route feeds the model token ids and a mask only: with images it would decode as if there were
    none, so it refuses and names them; plain batched decoding takes them."""
    model, prompt, _ = _lfm2_vl()
    ids, pixels = prompt(2, 0)
    with pytest.raises(ValueError, match="ignore pixel_attention_mask, pixel_values, spatial_shapes"):
        model.generate(ids, **pixels, past_key_values=ReplayCache(4), prompt_lookup_num_tokens=3, do_sample=False,
                       max_new_tokens=4)
    plain = model.generate(ids, **pixels, past_key_values=ReplayCache(4), do_sample=False, max_new_tokens=4)
    assert torch.equal(plain, model.generate(ids, **pixels, do_sample=False, max_new_tokens=4))
