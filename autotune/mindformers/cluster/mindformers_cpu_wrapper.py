"""MindFormers' training step for the CPU: ``MFTrainOneStepCell`` with an overflow check the CPU has.

Not imported by autotune (it imports MindFormers, which lives in a venv of its own): ``autotune
export`` copies this file beside a CPU export's mindformers.yaml, whose ``runner_wrapper`` names it
(``type: CpuTrainOneStepCell``, ``auto_register: mindformers_cpu_wrapper.CpuTrainOneStepCell``),
and ``launch.sh --mindformers`` passes the export folder to ``run_mindformer.py --register_path``.

Why: ``MFTrainOneStepCell`` inherits MindSpore's ``TrainOneStepWithLossScaleCell`` overflow check,
which on a CPU device reads Ascend's float-status register (``NPUGetFloatStatusV2``) or, on the GPU
path, uses ``FloatStatus`` — neither has a CPU kernel. This check tests every gradient with
``isfinite`` and sums the flags over the data-parallel ranks (all ranks skip the same steps).
"""

import mindspore.common.dtype as mstype
from mindformers.wrapper.wrapper import MFTrainOneStepCell
from mindspore import ops

_overflow = ops.MultitypeFuncGraph("overflow")


@_overflow.register("Tensor")
def _tensor_overflow(grad):
    return ops.cast(ops.logical_not(ops.isfinite(grad).all()), mstype.float32)


class CpuTrainOneStepCell(MFTrainOneStepCell):
    """``MFTrainOneStepCell`` whose overflow check runs on CPU."""

    def get_overflow_status(self, status, compute_output):
        flags = ops.AddN()(self.hyper_map(_overflow, compute_output)).reshape(())
        if self.is_distributed:
            flags = self.allreduce(flags)
        return self.less_equal(self.base, flags)
