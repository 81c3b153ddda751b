"""The bundle: build orchestration (`build`), the folder and its manifest, the report, and the parity check.

`edgeattn build` runs `edgeattn.bundle.build.build`: ONNX -> the target's build plan of graph passes
(`edgeattn.passes.plans`) -> an engine builder (`edgeattn.engines`) -> parity against the source -> a folder
written atomically with `manifest.json`. `config` holds what a build is asked to do and the checks that need
no model library; `fast_path` a cpu decoder's second graph.
"""
