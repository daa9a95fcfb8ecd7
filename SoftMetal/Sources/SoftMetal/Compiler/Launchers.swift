#if os(Linux)
/// The C++ the translation adds after the kernel source, per kernel: a body thunk that binds
/// its buffers, threadgroup memory and built-ins from the `sm_dispatch` of a launch, the
/// `extern "C"` launcher `__sm_launch_<name>` and the reflection table `__sm_info_<name>`.
extension MSLTranslator {
    static func builtinExpression(_ name: String) -> String {
        let g = "__g", d = "__d", l = "__L"
        switch name {
        case "thread_position_in_grid":
            return "\(g)->gpos[0] * \(d)->tptg[0] + \(l)->pos[0], \(g)->gpos[1] * \(d)->tptg[1] + \(l)->pos[1], \(g)->gpos[2] * \(d)->tptg[2] + \(l)->pos[2]"
        case "thread_position_in_threadgroup": return "\(l)->pos[0], \(l)->pos[1], \(l)->pos[2]"
        case "threadgroup_position_in_grid": return "\(g)->gpos[0], \(g)->gpos[1], \(g)->gpos[2]"
        case "threads_per_threadgroup": return "\(g)->size[0], \(g)->size[1], \(g)->size[2]"
        case "dispatch_threads_per_threadgroup": return "\(d)->tptg[0], \(d)->tptg[1], \(d)->tptg[2]"
        case "threadgroups_per_grid": return "\(d)->threadgroups[0], \(d)->threadgroups[1], \(d)->threadgroups[2]"
        case "threads_per_grid", "grid_size": return "\(d)->grid[0], \(d)->grid[1], \(d)->grid[2]"
        case "grid_origin": return "0, 0, 0"
        case "thread_index_in_threadgroup": return "\(l)->tid, 0, 0"
        case "thread_index_in_simdgroup": return "\(l)->lane, 0, 0"
        case "simdgroup_index_in_threadgroup": return "\(l)->sg, 0, 0"
        case "simdgroups_per_threadgroup": return "\(g)->nsg, 0, 0"
        case "dispatch_simdgroups_per_threadgroup": return "(\(d)->tptg[0] * \(d)->tptg[1] * \(d)->tptg[2] + 31) / 32, 0, 0"
        case "threads_per_simdgroup", "thread_execution_width": return "32, 0, 0"
        case "thread_index_in_quadgroup": return "\(l)->tid % 4, 0, 0"
        case "quadgroup_index_in_threadgroup": return "\(l)->tid / 4, 0, 0"
        case "quadgroups_per_threadgroup": return "(\(g)->n + 3) / 4, 0, 0"
        default: return "0, 0, 0"
        }
    }

    static func cString(_ s: String) -> String {
        "\"" + s.replacingAll("\\", with: "\\\\").replacingAll("\"", with: "\\\"") + "\""
    }

    /// `value`, or null/0 when the parameter's function constant is false (the host then
    /// neither requires nor binds it: kind 0 in the reflection table).
    static func present(_ p: Parameter, _ value: String) -> String {
        guard let c = p.condition else { return value }
        return "(\(c) ? \(value) : 0)"
    }

    static func launcher(_ k: Kernel) -> String {
        var args: [String] = []
        var infos: [String] = []
        let n = k.symbol
        for (index, parameter) in k.parameters.enumerated() {
            var p = parameter
            // A template instance binds by the instantiated parameter types, which C++ knows.
            if k.isTemplateInstance { p.type = "::metal::__sm::param_t<\(index), __sm_fn_\(n)>" }
            switch p.kind {
            case .buffer(let i):
                args.append("::metal::__sm::buf_arg<\(p.type)>(\(present(p, "__d->buffers[\(i)]")))")
                let kind = k.unusedParameters.contains(p.name) ? "0" : present(p, "SM_PARAM_BUFFER")
                infos.append("{\(kind), \(i), ::metal::__sm::elem_size<\(p.type)>(), \(parameter.type.hasSuffix("&") ? 1 : 0), \(cString(parameter.type)), \(cString(p.name)), \"buffer(\(i))\(parameter.coherent ? " coherent(device)" : "")\"}")
            case .threadgroup(let i):
                args.append("(\(p.type))\(present(p, "__d->tg_mem[\(i)]"))")
                let kind = k.unusedParameters.contains(p.name) ? "0" : present(p, "SM_PARAM_THREADGROUP")
                infos.append("{\(kind), \(i), ::metal::__sm::elem_size<\(p.type)>(), 0, \(cString(parameter.type)), \(cString(p.name)), \"threadgroup(\(i))\"}")
            case .builtin(let name):
                args.append("::metal::__sm::bi<\(p.type)>(\(builtinExpression(name)))")
                infos.append("{SM_PARAM_BUILTIN, -1, (int64_t)sizeof(\(p.type)), 0, \(cString(parameter.type)), \(cString(p.name)), \(cString(name))}")
            }
        }
        if infos.isEmpty { infos.append("{0, 0, 0, 0, \"\", \"\", \"\"}") }
        // For an instance, the lines that instantiate the template carry the MSL location of
        // the instantiation, so that clang's "in instantiation of ... requested here" points there.
        var instance = ""
        var call = "    \(k.callee)(\(args.joined(separator: ",\n        ")));"
        if let at = k.instantiatedAt {
            let here = "#line \(at.line) \(cString(at.file))\n"
            let back = "\n#line 1 \"softmetal-generated.cpp\"\n"
            instance = here + "using __sm_fn_\(n) = decltype(&\(k.callee));" + back
            call = here + "    \(k.callee)(\(args.joined(separator: ", ")));" + back
        }
        var maxThreads = "\(k.maxTotalThreadsPerThreadgroup)"
        if let expression = k.maxThreadsExpression {
            // Evaluated by C++, on a line that carries the kernel's MSL location.
            instance += "#line \(k.declaredAt.line) \(cString(k.declaredAt.file))\n"
                + "static constexpr int32_t __sm_max_\(n) = (int32_t)(\(expression));\n#line 1 \"softmetal-generated.cpp\"\n"
            maxThreads = "__sm_max_\(n)"
        }
        return """
        \(instance)static void __sm_body_\(n)(::metal::__sm::Lane* __L) {
            ::metal::__sm::Group* __g = __L->g;
            ::sm_dispatch* __d = __g->d;
            (void)__g; (void)__d;
        \(call)
        }
        extern "C" __attribute__((visibility("default"))) int32_t __sm_launch_\(n)(::sm_dispatch* d) {
            return ::metal::__sm::launch(d, &__sm_body_\(n));
        }
        static const ::sm_param_info __sm_params_\(n)[] = {
            \(infos.joined(separator: ",\n    "))
        };
        extern "C" __attribute__((visibility("default"))) const ::sm_kernel_info* __sm_info_\(n)(void) {
            static const ::sm_kernel_info info = {SM_ABI_VERSION, \(k.parameters.count), __sm_params_\(n), \(maxThreads)};
            return &info;
        }

        """
    }
}
#endif
