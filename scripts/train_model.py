r"""Trains a model with a gin config (resumes from the run's model_dir).

  python scripts/train_model.py --gin_file=configs/train/target.gin
  python scripts/train_model.py --gin_file=configs/train/target.gin \
      --gin.train.TrainConfig.num_steps=100 --gin.MODEL_DIR="'/tmp/t'" \
      --gin.config.T5Config.dropout_rate=0.1
"""

from absl import flags
import gin

from spec_decode import gin_utils
from spec_decode import train

FLAGS = flags.FLAGS
gin_utils.define_gin_flags()


def main(argv):
  del argv
  gin_utils.parse_gin_flags(modules=['train', 'model.config'])
  config = gin_utils.build(train.TrainConfig)
  print(gin.config_str(), flush=True)
  train.train(config)


if __name__ == '__main__':
  gin_utils.run(main)
