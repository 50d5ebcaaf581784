"""Conversational replies written by an LLM, as training text for the voice (`s5 data replies`, with the embedded
Gemma): an LLM voice agent speaks replies, not fortune cookies, so the corpus should hold some. The LLM comes in as
a function (question -> reply), so this package needs no LLM package."""
from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path

TOPICS = [
    "cooking pasta", "the weather this weekend", "learning to play the guitar", "saving money", "a trip to Japan",
    "growing tomatoes", "training for a marathon", "fixing a slow laptop", "choosing a new phone", "sleeping better",
    "writing a cover letter", "adopting a cat", "painting a bedroom", "baking bread", "learning Spanish",
    "planning a birthday party", "the history of Rome", "how airplanes fly", "drinking more water", "making coffee",
    "a good movie for tonight", "studying for an exam", "starting a small business", "cleaning the kitchen",
    "riding a bike in the city", "buying a used car", "the planets in our solar system", "taking better photos",
    "keeping houseplants alive", "a rainy day at home", "packing for a camping trip", "meeting new people",
    "reading more books", "making a budget", "a healthy breakfast", "the ocean tides", "volcanoes",
    "writing a poem", "learning to swim", "walking the dog",
]
QUESTIONS = [
    "Can you give me a tip about {}?", "What should I know about {}?", "Tell me something interesting about {}.",
    "I need some advice on {}.", "What is the first step for {}?", "Why do people enjoy {}?",
    "How long does {} usually take?", "What mistakes do beginners make with {}?", "Is {} expensive?",
    "What do you think about {}?",
]
SPEAKABLE = re.compile(r"[A-Za-z0-9 ,.'!?;:$%-]+")


def user_prompts(count: int, seed: int = 0) -> list[str]:
    prompts = [q.format(t) for t in TOPICS for q in QUESTIONS]
    random.Random(seed).shuffle(prompts)
    return prompts[:count]


def speakable_reply_sentences(reply: str, min_words: int = 3, max_words: int = 30) -> list[str]:
    """The sentences of a reply a voice can read as they are (the corpus's rule for fortunes)."""
    sentences = re.split(r"(?<=[.!?])\s+", " ".join(reply.split()))
    return [s for s in sentences if min_words <= len(s.split()) <= max_words and s[-1:] in ".!?" and SPEAKABLE.fullmatch(s)]


def write_replies(out: Path, reply: Callable[[str], str], count: int = 400, seed: int = 0, progress=None) -> int:
    """Ask `reply` `count` questions; append every new speakable sentence of its replies to `out` (one per line;
    what the file holds already is kept, so a run resumes). Returns the number of sentences in the file."""
    existing = [l.strip() for l in out.read_text().splitlines()] if out.exists() else []
    seen = {l for l in existing if l and not l.startswith("#")}
    prompts = user_prompts(count, seed)
    task = progress.add_task("LLM replies", total=len(prompts)) if progress else None
    with out.open("a") as f:
        if not existing:
            f.write("# Conversational replies written by the embedded Gemma 3 270M (`s5 data replies`): corpus text\n")
        for prompt in prompts:
            for sentence in speakable_reply_sentences(reply(prompt)):
                if sentence not in seen:
                    seen.add(sentence)
                    f.write(sentence + "\n")
            f.flush()
            if progress:
                progress.advance(task)
    return len(seen)
