"""spec_decode: exact speculative decoding for T5X-style encoder-decoders."""

import setuptools

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
                                  'data/samples/*']},
    include_package_data=True,
    python_requires='>=3.10',
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
        'test': ['pytest', 'hypothesis', 'scipy', 'sacrebleu'],
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
