"""The speed model read from the compiled kernels: compile (NVRTC, as the cuda backend does), disassemble
(cuobjdump), find each kernel's hot loop and count it (parse), and turn counts and shapes into call times on the
H200 (hw, model). bench/sass_model.py is the command line; bench/roofline.py builds the model's steps from it."""
