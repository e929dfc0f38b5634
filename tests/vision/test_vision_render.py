"""Token-exact rendering of conversations with images: the ids are the processor's own, whole or
turn by turn, for each tiny family."""

from __future__ import annotations

import pytest

from rollforge.chat.render import ChatRenderer
from rollforge.chat.vision import VisionRenderer, renderer_for
from rollforge.errors import TemplateError
from rollforge.types import Message

from vision_helpers import picture

REPLY = "Let me look at the next one."


def _conversation():
    """A prompt with a picture, a reply, and a tool result with two more (three sizes)."""
    first, second, third = picture(0), picture(1, (100, 90)), picture(2, (30, 30))
    return (
        Message("system", "Count what you see."),
        Message("user", "What is in the picture?", images=(first,)),
        Message("assistant", REPLY),
        Message("tool", "Pictures 2 and 3.", name="show", images=(second, third)),
    ), [first, second, third]


def test_a_rendering_is_the_processors_own_tokens(vlm):
    _, _, processor = vlm
    renderer = VisionRenderer(processor)
    messages, images = _conversation()
    expected = processor(text=[renderer.render_text(messages)], images=[images], add_special_tokens=False)
    ids = renderer.conversation_ids(messages)
    assert ids == list(expected["input_ids"][0])
    placeholders = ids.count(renderer.images.placeholder_id)
    assert placeholders == sum(renderer.images.tokens(image) for image in images) > 3  # expanded, not one each


def test_turn_by_turn_ids_equal_the_whole_rendering(vlm):
    _, _, processor = vlm
    renderer = VisionRenderer(processor)
    messages, _ = _conversation()
    generated = renderer.encode(REPLY) + renderer.closing
    ids = renderer.prompt_ids(messages[:2]) + renderer.generation_prompt + generated
    ids += renderer.closing_ids(generated) + renderer.delta_ids(messages[3:])
    assert ids == renderer.conversation_ids(messages)


def test_a_tool_result_with_images_is_not_framed_as_text(vlm):
    """A text-only tool result first fills the frame cache; one with an image must still render its image."""
    _, _, processor = vlm
    renderer = VisionRenderer(processor)
    plain = renderer.delta_ids([Message("tool", "nothing", name="show")])
    with_image = renderer.delta_ids([Message("tool", "nothing", name="show", images=(picture(3),))])
    assert plain.count(renderer.images.placeholder_id) == 0
    assert with_image.count(renderer.images.placeholder_id) == renderer.images.tokens(picture(3)) > 0


def test_text_messages_render_as_the_text_renderer_does(vlm):
    _, _, processor = vlm
    messages = (Message("user", "Hello"), Message("assistant", "Hi"), Message("tool", "ok", name="t"))
    text = ChatRenderer(processor.tokenizer)
    assert VisionRenderer(processor).conversation_ids(messages) == text.conversation_ids(messages)
    assert isinstance(renderer_for(processor), VisionRenderer)
    assert type(renderer_for(processor.tokenizer)) is ChatRenderer


def test_a_template_that_drops_image_blocks_is_a_template_error(vlm):
    _, _, processor = vlm
    renderer = VisionRenderer(processor)
    renderer.tokenizer = _DropsImages(processor.tokenizer)
    with pytest.raises(TemplateError, match=r"wrote 0 image placeholders .* for 1 images of roles \['user'\]"):
        renderer.conversation_ids([Message("user", "What is it?", images=(picture(0),))])


def test_encoded_images_render_as_their_pictures(vlm):
    """Trajectory JSON brings images back as PNG bytes: they expand as the picture does."""
    from rollforge.json_forms import image_bytes

    _, _, processor = vlm
    renderer = VisionRenderer(processor)
    image = picture(1, (100, 90))
    as_bytes = image_bytes(image)[1]
    assert renderer.images.expansion(as_bytes) == renderer.images.expansion(image)


class _DropsImages:
    """A tokenizer whose template leaves out image blocks (renders only the text blocks)."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def apply_chat_template(self, messages, **kwargs):
        def text_only(m):
            if isinstance(m.get("content"), list):
                return {**m, "content": "".join(b.get("text", "") for b in m["content"])}
            return m

        return self._inner.apply_chat_template([text_only(m) for m in messages], **kwargs)
