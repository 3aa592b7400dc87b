"""Interop with the world outside: the Gymnasium adapter (:mod:`.gym_adapter`), Minari datasets
(:mod:`.minari_io`) and the reference benchmark's files (:mod:`.reference`).

These readers and writers sit above the environments, the data layer and the sentence encoder: they
ask the registry for an environment's state width and predicates and embed instruction strings.
"""
