"""Replies with their sentences, split by hand: what a voice should receive.

English, German, Chinese and Japanese, written like an assistant's replies
(abbreviations, numbers, ordinals, quotes, lists). Used by
``tests/stages/test_text_chunks.py`` and by ``bench/text_chunks.py``, which
compares the chunker with pysbd and stream2sentence on the same texts.
Each entry: (language, expected sentences); the text is the sentences joined
by one space (none for Chinese and Japanese, which are written without).
"""

from __future__ import annotations

CORPUS: list[tuple[str, list[str]]] = [
    # -- English ------------------------------------------------------------------
    (
        "en",
        [
            "The Moon is about 384,400 km away.",
            "It has no atmosphere!",
            "Would you like to know more?",
        ],
    ),
    ("en", ["Dr. Smith measured it at 3.14 m.", "Mr. Jones disagreed."]),
    ("en", ["Fruit, e.g. apples and pears, keeps well.", "Store it cold, i.e. below 4 degrees."]),
    ("en", ["J. R. R. Tolkien wrote it in 1937.", "It sold well."]),
    ("en", ['She said, "It is late."', "Then she left."]),
    ("en", ["The answer is 42.", "That is all."]),
    ("en", ["Wait...", "Really?", "Yes!"]),
    ("en", ["It costs approx. 5 dollars (see fig. 2).", "That is cheap."]),
    ("en", ["Mt. Everest is 8,849 m high.", "It is in Nepal."]),
    ("en", ["1. Boil the water.", "2. Add the tea."]),
    # -- German -------------------------------------------------------------------
    ("de", ["Das ist z.B. ein Apfel.", "Er schmeckt gut."]),
    ("de", ["Das ist z. B. ein Apfel.", "Er schmeckt gut."]),
    ("de", ["Es kostet ca. 5 Euro.", "Das ist günstig."]),
    ("de", ["Wir treffen uns am 3. Mai in Berlin.", "Kommst du mit?"]),
    ("de", ["Im 19. Jahrhundert wuchs die Stadt stark.", "Heute leben dort 2,5 Mio. Menschen."]),
    ("de", ["Dr. Müller wohnt in der Hauptstr. 5.", "Er ist Arzt."]),
    ("de", ["Äpfel, Birnen bzw. Pflaumen sind Obst.", "Gemüse ist gesund."]),
    ("de", ["Das Zimmer Nr. 12 ist frei.", "Möchten Sie es buchen?"]),
    ("de", ["Die Temperatur beträgt 21.5 Grad.", "Es ist warm!"]),
    ("de", ["Er sagte: „Ich komme morgen.“", "Dann ging er."]),
    ("de", ["Das gilt d. h. für alle.", "Wirklich?", "Ja!"]),
    ("de", ["Sie wurde am 1. Januar 1990 geboren.", "Sie ist Lehrerin."]),
    ("de", ["Zum 2. Mal gewann er den Preis.", "Alle jubelten."]),
    ("de", ["Vgl. dazu Kapitel 4.", "Dort steht mehr."]),
    # -- Chinese ------------------------------------------------------------------
    ("zh", ["月球距离地球大约三十八万公里。", "它没有大气层！", "你想知道更多吗？"]),
    ("zh", ["今天天气很好。", "我们去公园吧。"]),
    ("zh", ["他说：“我明天来。”", "然后他就走了。"]),
    ("zh", ["圆周率约等于3.14。", "这是一个无理数。"]),
    ("zh", ["真的吗？！", "太好了。"]),
    ("zh", ["我喜欢Python!", "你呢?"]),
    ("zh", ["第一，准备材料；第二，开始制作。", "很简单。"]),
    # -- Japanese -----------------------------------------------------------------
    (
        "ja",
        ["月は地球から約38万キロ離れています。", "大気はありません！", "もっと知りたいですか？"],
    ),
    ("ja", ["彼は「こんにちは。」と言った。", "そして帰った。"]),
    ("ja", ["今日は晴れです。", "散歩しましょう。"]),
    ("ja", ["『ありがとう。』", "彼女は笑った。"]),
    ("ja", ["値段は3.5ドルです。", "安いですね！"]),
    ("ja", ["本当ですか？", "はい、本当です。"]),
]

SPACED = frozenset({"en", "de"})


def text_of(language: str, sentences: list[str]) -> str:
    """The reply as a decoder writes it: sentences joined by a space (none in CJK)."""
    return (" " if language in SPACED else "").join(sentences)
