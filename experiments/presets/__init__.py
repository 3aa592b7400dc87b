"""The ``imaginejax`` command's TOML presets (this folder installs as ``imaginejax.presets``).

Every ``*.toml`` here is a preset: ``imaginejax bench --preset <stem>``. The folder is mapped into the
package by ``pyproject.toml`` so an installed (non-editable) ``imaginejax``, e.g. in Colab, has them too.
"""
