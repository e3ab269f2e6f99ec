"""keras-preact: the pre-activation residual networks of He et al. (ECCV 2016) in Keras 3.

Reference:
    He, Zhang, Ren, Sun. "Identity Mappings in Deep Residual Networks", ECCV 2016.
    https://arxiv.org/abs/1603.05027
"""

from keras_preact import analysis, architectures, defaults, merges, pretrained, shortcuts, stacked, units
from keras_preact.architectures import ARCHITECTURES, Architecture
from keras_preact.merges import (
    Addition,
    ConstantScaling,
    ExclusiveGating,
    NoShortcut,
    ShortcutDropout,
    ShortcutOnlyGating,
)
from keras_preact.models import (
    MODELS,
    CifarResNet,
    ResNet,
    ResNet18,
    ResNet20,
    ResNet32,
    ResNet34,
    ResNet44,
    ResNet50,
    ResNet56,
    ResNet101,
    ResNet110,
    ResNet110OneLayer,
    ResNet152,
    ResNet164,
    ResNet200,
    ResNet1001,
    ResNet1202,
    copy_weights,
    get_model,
    list_models,
)
from keras_preact.pretrained import decode_predictions, preprocess_input
from keras_preact.stacked import StackedUnits
from keras_preact.units import (
    BatchNormAfterAdditionUnit,
    OriginalUnit,
    PreActivationUnit,
    ReLUBeforeAdditionUnit,
    ReLUOnlyPreActivationUnit,
)

__version__ = "0.1.0"
