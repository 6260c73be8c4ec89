// same_shape<Frozen, Current>: whether a type of a frozen header snapshot (included inside a
// namespace) is the same C type as one of the current header: fundamental types identical; each
// snapshot struct the current struct of the same name (counterpart, specialised by the generated
// snapshot layout tests); pointers, const, arrays and function types (a slot's signature: return
// type and every parameter) compared part by part.
#pragma once

#include <cstddef>
#include <type_traits>

namespace nxmem::test {

template <class Frozen> struct counterpart; // specialised per snapshot struct

template <class T>
concept has_counterpart = requires { typename counterpart<T>::type; };

template <class... T> struct type_list {};

template <class Frozen, class Current> struct same_shape : std::is_same<Frozen, Current> {};

template <class Frozen, class Current>
    requires has_counterpart<Frozen>
struct same_shape<Frozen, Current> : std::is_same<typename counterpart<Frozen>::type, Current> {};

template <class Frozen, class Current>
struct same_shape<Frozen*, Current*> : same_shape<Frozen, Current> {};

template <class Frozen, class Current>
struct same_shape<const Frozen, const Current> : same_shape<Frozen, Current> {};

template <class Frozen, class Current, std::size_t N>
struct same_shape<Frozen[N], Current[N]> : same_shape<Frozen, Current> {};

template <class Frozen, class Current> struct same_parameters : std::false_type {};

template <class... Frozen, class... Current>
    requires(sizeof...(Frozen) == sizeof...(Current))
struct same_parameters<type_list<Frozen...>, type_list<Current...>>
    : std::conjunction<same_shape<Frozen, Current>...> {};

template <class FrozenResult, class... FrozenParameters, class CurrentResult,
          class... CurrentParameters>
struct same_shape<FrozenResult(FrozenParameters...), CurrentResult(CurrentParameters...)>
    : std::conjunction<same_shape<FrozenResult, CurrentResult>,
                       same_parameters<type_list<FrozenParameters...>,
                                       type_list<CurrentParameters...>>> {};

} // namespace nxmem::test
