"""The bundle: build orchestration (`build`), the folder and its manifest, the report, and the parity check.

`edgeattn build` runs `edgeattn.bundle.build.build`: ONNX -> graph passes -> an engine builder
(`edgeattn.engines`) -> parity against the source -> a folder written atomically with `manifest.json`.
"""
