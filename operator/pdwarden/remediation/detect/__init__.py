"""Stage 2, detect: samples and room views into findings (wedged, stale, leaking).

Why: the rules that decide a pod is sick are pure and unit-tested apart from any I/O."""
