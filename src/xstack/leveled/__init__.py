"""Leveled measurement (``design.md`` §4): each level timed in a pass of its own, the passes merged by structure.

``passes.measure`` runs a step function once per level set; ``script`` does the same for a program whose
iterations are marked with ``xstack.step()``; ``merge.merge_passes`` makes the merged profile.
"""
