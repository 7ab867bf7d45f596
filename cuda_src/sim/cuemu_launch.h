// cuemu_launch.h -- part of cuemu.h (the CPU emulator); included only by cuemu.h, in its order.
// Trampolines: kernel parameter unpacking and signatures, the C ABI the worker calls.
#ifndef CUEMU_LAUNCH_H_INCLUDED
#define CUEMU_LAUNCH_H_INCLUDED

namespace cuemu {

// ---- trampolines --------------------------------------------------------------
template <class T, class = void> struct TypeName { static constexpr const char* value = nullptr; };
#define CUEMU_TN(T, S) template <> struct TypeName<T> { static constexpr const char* value = S; };
CUEMU_TN(int, "int") CUEMU_TN(unsigned int, "unsigned int") CUEMU_TN(long long, "long long")
CUEMU_TN(unsigned long long, "unsigned long long") CUEMU_TN(long, "long") CUEMU_TN(unsigned long, "unsigned long")
CUEMU_TN(short, "short") CUEMU_TN(unsigned short, "unsigned short") CUEMU_TN(char, "char")
CUEMU_TN(signed char, "signed char") CUEMU_TN(unsigned char, "unsigned char") CUEMU_TN(bool, "bool")
CUEMU_TN(float, "float") CUEMU_TN(double, "double") CUEMU_TN(__nv_bfloat16, "__nv_bfloat16")
CUEMU_TN(__nv_bfloat162, "__nv_bfloat162") CUEMU_TN(float2, "float2") CUEMU_TN(float4, "float4")
CUEMU_TN(int2, "int2") CUEMU_TN(int4, "int4") CUEMU_TN(uint2, "uint2") CUEMU_TN(uint4, "uint4")
CUEMU_TN(char4, "char4") CUEMU_TN(uchar4, "uchar4") CUEMU_TN(void, "void")
#undef CUEMU_TN

template <class T>
static inline std::string param_type_name() {
  if constexpr (std::is_pointer<T>::value) {
    using P = typename std::remove_pointer<T>::type;
    using B = typename std::remove_cv<P>::type;
    std::string s = std::is_const<P>::value ? "const " : "";
    if constexpr (std::is_pointer<B>::value) s += "void*";  // pointer to pointer: opaque
    else s += TypeName<B>::value ? TypeName<B>::value : "struct";
    return s + "*";
  } else {
    static_assert(TypeName<T>::value != nullptr && !std::is_same<T, void>::value,
                  "cuemu: unsupported kernel parameter type (use pointers or int/unsigned/float/long long/size_t/...)");
    return TypeName<T>::value;
  }
}

template <class F> struct Traits;
template <class... A> struct Traits<void (*)(A...)> {
  using Tuple = std::tuple<typename std::decay<A>::type...>;
  static constexpr size_t N = sizeof...(A);
  static std::string sig() {
    std::string s;
    ((s += (s.empty() ? "" : "|") + param_type_name<typename std::decay<A>::type>()), ...);
    return s;
  }
};

template <class Tuple, size_t... I>
static inline void unpack(Tuple& t, void** args, std::index_sequence<I...>) {
  ((std::memcpy((void*)&std::get<I>(t), args[I], sizeof(std::get<I>(t)))), ...);
}

template <auto K>
static void kernel_thunk(void* ctx) {
  using Tup = typename Traits<decltype(K)>::Tuple;
  std::apply(K, *static_cast<Tup*>(ctx));
}

template <auto K>
static inline int launch(const char* name, const unsigned* g, const unsigned* b, unsigned long long smem, void** args) {
  using T = Traits<decltype(K)>;
  typename T::Tuple tup;
  unpack(tup, args, std::make_index_sequence<T::N>());
  return run_grid(name, g, b, smem, &kernel_thunk<K>, &tup);
}

template <auto K>
static inline const char* signature() {
  static const std::string s = Traits<decltype(K)>::sig();
  return s.c_str();
}

}  // namespace cuemu

// ---- C ABI used by the worker ---------------------------------------------------
extern "C" {
__attribute__((visibility("default"))) void cuemu_set_order(int order, unsigned long long seed) {
  cuemu::rt.order = order;
  cuemu::rt.seed = seed;
}
__attribute__((visibility("default"))) const char* cuemu_last_error(void) { return cuemu::rt.err.c_str(); }
__attribute__((visibility("default"))) void cuemu_set_crash_area(char* area, size_t len, void* arena, size_t arena_size) {
  cuemu::rt.crash_area = area;
  cuemu::rt.crash_len = len;
  cuemu::rt.arena_base = (uintptr_t)arena;
  cuemu::rt.arena_size = arena_size;
  cuemu::install_crash_handlers();
}
__attribute__((visibility("default"))) int cuemu_abi_version(void) { return 1; }
}

#endif  // CUEMU_LAUNCH_H_INCLUDED
