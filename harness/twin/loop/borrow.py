"""An item of a Numba typed list, borrowed: for kernels compiled without
Numba's runtime (``_nrt=False``).

Why: the fleet kernel keeps each instance's bundles (some forty arrays)
in a typed list. Taking one out with ``bundles[k]`` increments the
reference count of every array in it, atomically, and decrements them all
when it goes out of use, and each inner call the kernel then makes does
the same for the arrays it is handed. On an sfs-cc replay at 24 instances
that was a seventh of the time (``docs/results/fleet.md``, the fleet twin's speed).
Compiled without the runtime, a kernel takes no references at all; this
is the one read of a typed list such a kernel needs: the item as stored,
no reference taken, so none to release. The list must outlive the call
(the caller holds it) and the item must not be kept beyond it (nothing
compiled without the runtime can keep it).
"""
from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, errors
from numba.extending import intrinsic
from numba.typed.listobject import ll_list_type, ll_voidptr_type


@intrinsic
def borrow_item(typingctx, l_ty, index_ty):
    """``l[index]`` for a typed list ``l`` and an index in range (not
    checked), without a reference: only in code compiled with
    ``_nrt=False``, where nothing would release one (refused elsewhere)."""
    item_ty = l_ty.item_type
    sig = item_ty(l_ty, index_ty)

    def codegen(context, builder, sig, args):
        if context.enable_nrt:
            raise errors.NumbaRuntimeError("borrow_item: only in code compiled without the runtime (_nrt=False)")
        lst, index = args
        lp = builder.bitcast(cgutils.create_struct_proxy(sig.args[0])(context, builder, value=lst).data,
                             ll_list_type)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ll_voidptr_type, [ll_list_type]),
                                            "numba_list_base_ptr")
        base = builder.bitcast(builder.call(fn, [lp]), context.get_data_type(item_ty).as_pointer())
        return context.data_model_manager[item_ty].load_from_data_pointer(builder, cgutils.gep(builder, base, index))

    return sig, codegen
