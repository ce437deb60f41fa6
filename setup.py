"""spec_decode: exact speculative decoding for T5X-style encoder-decoders.

`pip install .` also compiles the CPU decoding kernels
(`spec_decode/kernels/*.cc`: the few-row matrix product and the decoder
call's attention) against the XLA FFI headers jaxlib ships
(`jax.ffi.include_dir()`; jax is a build requirement for that). It is
optional: where no C++ compiler is found, or the build fails, the install
still succeeds and decoding uses XLA's dots (`spec_decode.kernels` says so
once in the log).
"""

import setuptools
from setuptools.command import build_ext


class BuildOptionalKernels(build_ext.build_ext):
  """Builds the kernel library; a failure leaves XLA's dots in charge."""

  def finalize_options(self):
    super().finalize_options()
    try:
      import jax  # pylint: disable=g-import-not-at-top
      include = jax.ffi.include_dir()
    except Exception as error:  # pylint: disable=broad-except
      print(f'spec_decode: jax.ffi.include_dir() failed ({error}); the CPU '
            'decoding kernels will not be built.')
      include = None
    for extension in self.extensions:
      if include is not None:
        extension.include_dirs.append(include)
      else:
        extension.sources = []

  def build_extension(self, ext):
    if not ext.sources:
      return
    try:
      super().build_extension(ext)
    except Exception as error:  # pylint: disable=broad-except
      print(f'spec_decode: the CPU decoding kernels were not built ({error}); '
            "decoding will use XLA's dots.")

  def get_outputs(self):
    # Only what was built: a skipped kernel is not an install error.
    import os  # pylint: disable=g-import-not-at-top
    return [path for path in super().get_outputs() if os.path.exists(path)]


# A shared library loaded with ctypes and registered with
# jax.ffi.register_ffi_target; built like an extension module so the wheel
# is tagged for this platform. -O3 vectorises the portable path; the AVX2
# and AVX-512 paths are compiled through target attributes and chosen at
# run time, so no -march flag ties the library to the build machine.
FEW_ROW_KERNEL = setuptools.Extension(
    'spec_decode.kernels._few_rows',
    sources=['spec_decode/kernels/few_rows.cc',
             'spec_decode/kernels/bf16_products.cc',
             'spec_decode/kernels/amx_products.cc',
             'spec_decode/kernels/amx_split.cc',
             'spec_decode/kernels/peak_rate.cc',
             'spec_decode/kernels/decode_attention.cc'],
    depends=['spec_decode/kernels/amx_products.h',
             'spec_decode/kernels/cpu_features.h',
             'spec_decode/kernels/parallel.h'],
    language='c++',
    extra_compile_args=['-O3', '-std=c++17', '-fno-math-errno'],
    optional=True,
)

setuptools.setup(
    name='spec_decode',
    version='0.1.0',
    description=('Speculative decoding (Leviathan et al., ICML 2023) for T5 '
                 'encoder-decoders in JAX/Flax, mirroring T5X.'),
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    packages=setuptools.find_packages(include=['spec_decode', 'spec_decode.*']),
    package_data={'spec_decode': ['pretrained/assets/*',
                                  'pretrained/assets/*/*',
                                  'pretrained/assets/*/*/*',
                                  # zarr metadata files start with a dot.
                                  'pretrained/assets/*/*/.z*',
                                  'data/samples/*',
                                  'kernels/*.cc', 'kernels/*.h']},
    include_package_data=True,
    python_requires='>=3.10',
    # The kernel's build reads the XLA FFI headers from jaxlib.
    setup_requires=['jax>=0.4.35'],
    ext_modules=[FEW_ROW_KERNEL],
    cmdclass={'build_ext': BuildOptionalKernels},
    install_requires=[
        'absl-py',
        'flax>=0.10',
        'gin-config',
        'jax>=0.4.35',
        'msgpack',
        'numpy',
        'optax',
        'safetensors',
        'sentencepiece',
        'tensorstore',
    ],
    extras_require={
        # seqio task registration (T5X users) and translation scores.
        'data': ['seqio', 'tensorflow-cpu', 'sacrebleu'],
        # pytest-xdist: the README's test commands run two workers (most of
        # the suite's time is compiling, one core each). nbclient ..
        # matplotlib: tests/test_notebook.py runs the tutorial notebook
        # (scripts/notebooks/).
        'test': ['pytest', 'pytest-xdist', 'hypothesis', 'scipy', 'sacrebleu',
                 'nbclient', 'nbformat', 'ipykernel', 'matplotlib'],
        'plots': ['matplotlib'],
    },
    entry_points={
        # The same as `python -m spec_decode.main` / `spec_decode.infer`.
        'console_scripts': [
            'spec-decode = spec_decode.main:cli',
            'spec-decode-infer = spec_decode.infer:cli',
        ],
    },
    license='Apache-2.0',
)
