"""terraformer: Scaling Transformers and the Terraformer as Trax combinators."""
import glob
import importlib.util
import os
import re

import setuptools

_HERE = os.path.dirname(os.path.abspath(__file__))


def _read(name):
  with open(os.path.join(_HERE, name), encoding='utf-8') as f:
    return f.read()


def _version():
  """`__version__` of terraformer/__init__.py, read as text: the package
  imports its dependencies, which a build may not have yet."""
  found = re.search(r"^__version__ = '([^']+)'$",
                    _read(os.path.join('terraformer', '__init__.py')), re.M)
  if not found:
    raise RuntimeError("no __version__ = '...' line in terraformer/__init__.py")
  return found.group(1)


def _xla_ffi_include():
  """jaxlib's XLA FFI headers (jax.ffi.include_dir()), found without
  importing jax; jaxlib is a build requirement (pyproject.toml)."""
  spec = importlib.util.find_spec('jaxlib')
  if spec is None or not spec.submodule_search_locations:
    return None
  include = os.path.join(list(spec.submodule_search_locations)[0], 'include')
  return include if os.path.isdir(include) else None


# The fused decode kernels (terraformer/kernels/*.cc and their headers),
# called through jax.ffi: one shared library loaded with ctypes. Optional:
# without a compiler or the headers the install goes on and decoding keeps
# XLA's path.
_include = _xla_ffi_include()


def _kernel_files(pattern):
  """The kernels' files matching `pattern`, relative to this folder."""
  return sorted(glob.glob(os.path.join('terraformer', 'kernels', pattern),
                          root_dir=_HERE))


# The kernels' files compile in parallel, one compiler per core
# (TERRAFORMER_BUILD_JOBS=N: N at a time), by pybind11's helper, a build
# requirement (pyproject.toml); without it, one file at a time.
try:
  from pybind11.setup_helpers import ParallelCompile
except ImportError:
  ParallelCompile = None
if ParallelCompile is not None:
  ParallelCompile('TERRAFORMER_BUILD_JOBS').install()

_kernels = [setuptools.Extension(
    'terraformer.kernels._decode_kernels',
    sources=_kernel_files('*.cc'),
    depends=_kernel_files('*.h'),
    include_dirs=[_include] if _include else [],
    language='c++',
    extra_compile_args=['-O3', '-std=c++17', '-fno-math-errno'],
    optional=True,
)] if _include else []

setuptools.setup(
    name='terraformer',
    version=_version(),
    description=('Sparse is Enough in Scaling Transformers (Jaszczur et al.): '
                 'sparse layers, Scaling Transformer and Terraformer in Trax.'),
    long_description=_read('README.md'),
    long_description_content_type='text/markdown',
    author='The terraformer Authors',
    license='Apache-2.0',
    license_files=['LICENSE'],
    classifiers=[
        'Development Status :: 3 - Alpha',
        'Intended Audience :: Science/Research',
        'License :: OSI Approved :: Apache Software License',
        'Programming Language :: Python :: 3',
        'Programming Language :: Python :: 3.11',
        'Topic :: Scientific/Engineering :: Artificial Intelligence',
    ],
    # The repository's gin/ travels as terraformer/gin_configs, where an
    # installed terraformer.config finds it (GIN_DIR).
    packages=setuptools.find_packages(include=['terraformer', 'terraformer.*'])
    + ['terraformer.gin_configs'],
    package_dir={'terraformer.gin_configs': 'gin'},
    # The kernels' sources travel in the sdist whether or not this build
    # found the headers to compile them (a wheel built from the sdist does).
    package_data={'terraformer.kernels': ['*.cc', '*.h'],
                  'terraformer.gin_configs': ['*/*.gin', '*/*/*.gin']},
    ext_modules=_kernels,
    python_requires='>=3.11,<3.12',
    install_requires=[
        'trax==1.4.1',
        'jax>=0.10,<0.11',
        'jaxlib>=0.10,<0.11',
        'tensorflow>=2.21,<2.22',
        'tensorflow-text>=2.21,<2.22',
        'tensorflow-datasets>=4.9,<4.10',
        'numpy>=2,<3',
        'gin-config==0.5.0',
        'sentencepiece>=0.2,<0.3',
        'aclsum==0.1.2',
        'tqdm>=4.66',
        'orbax-checkpoint>=0.12.4,<0.13',
    ],
    extras_require={
        'test': ['pytest>=8', 'pytest-xdist>=3.8'],
        'eval': ['rouge-score==0.1.2', 'matplotlib>=3.8', 'tensorboard>=2.21,<2.22'],
    },
    entry_points={
        'console_scripts': [
            'terraformer-train=terraformer.cli.train:main',
            'terraformer-info=terraformer.cli.info:main',
            'terraformer-bench=terraformer.cli.bench:main',
            'terraformer-decode=terraformer.cli.decode:main',
            'terraformer-eval=terraformer.cli.eval:main',
            'terraformer-export=terraformer.cli.export:main',
            'terraformer-memory-bench=terraformer.cli.memory_bench:main',
            'terraformer-ood=terraformer.cli.ood:main',
            'terraformer-import-trax=terraformer.cli.import_trax:main',
            'terraformer-topk-bench=terraformer.cli.topk_bench:main',
        ],
    },
)
