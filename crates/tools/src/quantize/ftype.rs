//! llama.cpp's file types (`enum llama_ftype`, stored as `general.file_type`) and
//! llama-quantize's names for them.

use lamina_core::DType;

/// A file type: the mixture of tensor types a quantized file is made of. The discriminants are
/// llama.cpp's `llama_ftype` values, as stored in `general.file_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
#[allow(non_camel_case_types)]
pub enum FileType {
    ALL_F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q8_0 = 7,
    Q5_0 = 8,
    Q5_1 = 9,
    Q2_K = 10,
    Q3_K_S = 11,
    Q3_K_M = 12,
    Q3_K_L = 13,
    Q4_K_S = 14,
    Q4_K_M = 15,
    Q5_K_S = 16,
    Q5_K_M = 17,
    Q6_K = 18,
    IQ2_XXS = 19,
    IQ2_XS = 20,
    Q2_K_S = 21,
    IQ3_XS = 22,
    IQ3_XXS = 23,
    IQ1_S = 24,
    IQ4_NL = 25,
    IQ3_S = 26,
    IQ3_M = 27,
    IQ2_S = 28,
    IQ2_M = 29,
    IQ4_XS = 30,
    IQ1_M = 31,
    BF16 = 32,
    TQ1_0 = 36,
    TQ2_0 = 37,
    MXFP4_MOE = 38,
    NVFP4 = 39,
    Q1_0 = 40,
    Q2_0 = 41,
}

/// One entry of llama-quantize's type list: the name it accepts, the file type, and its
/// description (size and perplexity figures, or bits per weight).
#[derive(Clone, Copy, Debug)]
pub struct QuantOption {
    pub name: &'static str,
    pub ftype: FileType,
    pub desc: &'static str,
}

/// llama-quantize's `QUANT_OPTIONS`, in its order (which `--help` prints and name lookup
/// follows: `COPY` comes after `F32` so that file type 0 finds `F32`).
pub const QUANT_OPTIONS: &[QuantOption] = &[
    opt("Q1_0", FileType::Q1_0, " 1.125 bpw quantization"),
    opt("Q2_0", FileType::Q2_0, " 2.25 bpw quantization (group 64)"),
    opt("Q4_0", FileType::Q4_0, " 4.34G, +0.4685 ppl @ Llama-3-8B"),
    opt("Q4_1", FileType::Q4_1, " 4.78G, +0.4511 ppl @ Llama-3-8B"),
    opt("MXFP4_MOE", FileType::MXFP4_MOE, " MXFP4 MoE"),
    opt("Q5_0", FileType::Q5_0, " 5.21G, +0.1316 ppl @ Llama-3-8B"),
    opt("Q5_1", FileType::Q5_1, " 5.65G, +0.1062 ppl @ Llama-3-8B"),
    opt("IQ2_XXS", FileType::IQ2_XXS, " 2.06 bpw quantization"),
    opt("IQ2_XS", FileType::IQ2_XS, " 2.31 bpw quantization"),
    opt("IQ2_S", FileType::IQ2_S, " 2.5  bpw quantization"),
    opt("IQ2_M", FileType::IQ2_M, " 2.7  bpw quantization"),
    opt("IQ1_S", FileType::IQ1_S, " 1.56 bpw quantization"),
    opt("IQ1_M", FileType::IQ1_M, " 1.75 bpw quantization"),
    opt("TQ1_0", FileType::TQ1_0, " 1.69 bpw ternarization"),
    opt("TQ2_0", FileType::TQ2_0, " 2.06 bpw ternarization"),
    opt("Q2_K", FileType::Q2_K, " 2.96G, +3.5199 ppl @ Llama-3-8B"),
    opt(
        "Q2_K_S",
        FileType::Q2_K_S,
        " 2.96G, +3.1836 ppl @ Llama-3-8B",
    ),
    opt("IQ3_XXS", FileType::IQ3_XXS, " 3.06 bpw quantization"),
    opt("IQ3_S", FileType::IQ3_S, " 3.44 bpw quantization"),
    opt("IQ3_M", FileType::IQ3_M, " 3.66 bpw quantization mix"),
    opt("Q3_K", FileType::Q3_K_M, "alias for Q3_K_M"),
    opt("IQ3_XS", FileType::IQ3_XS, " 3.3 bpw quantization"),
    opt(
        "Q3_K_S",
        FileType::Q3_K_S,
        " 3.41G, +1.6321 ppl @ Llama-3-8B",
    ),
    opt(
        "Q3_K_M",
        FileType::Q3_K_M,
        " 3.74G, +0.6569 ppl @ Llama-3-8B",
    ),
    opt(
        "Q3_K_L",
        FileType::Q3_K_L,
        " 4.03G, +0.5562 ppl @ Llama-3-8B",
    ),
    opt(
        "IQ4_NL",
        FileType::IQ4_NL,
        " 4.50 bpw non-linear quantization",
    ),
    opt(
        "IQ4_XS",
        FileType::IQ4_XS,
        " 4.25 bpw non-linear quantization",
    ),
    opt("Q4_K", FileType::Q4_K_M, "alias for Q4_K_M"),
    opt(
        "Q4_K_S",
        FileType::Q4_K_S,
        " 4.37G, +0.2689 ppl @ Llama-3-8B",
    ),
    opt(
        "Q4_K_M",
        FileType::Q4_K_M,
        " 4.58G, +0.1754 ppl @ Llama-3-8B",
    ),
    opt("Q5_K", FileType::Q5_K_M, "alias for Q5_K_M"),
    opt(
        "Q5_K_S",
        FileType::Q5_K_S,
        " 5.21G, +0.1049 ppl @ Llama-3-8B",
    ),
    opt(
        "Q5_K_M",
        FileType::Q5_K_M,
        " 5.33G, +0.0569 ppl @ Llama-3-8B",
    ),
    opt("Q6_K", FileType::Q6_K, " 6.14G, +0.0217 ppl @ Llama-3-8B"),
    opt("Q8_0", FileType::Q8_0, " 7.96G, +0.0026 ppl @ Llama-3-8B"),
    opt("F16", FileType::F16, "14.00G, +0.0020 ppl @ Mistral-7B"),
    opt("BF16", FileType::BF16, "14.00G, -0.0050 ppl @ Mistral-7B"),
    opt("F32", FileType::ALL_F32, "26.00G              @ 7B"),
    opt(
        "COPY",
        FileType::ALL_F32,
        "only copy tensors, no quantizing",
    ),
];

const fn opt(name: &'static str, ftype: FileType, desc: &'static str) -> QuantOption {
    QuantOption { name, ftype, desc }
}

impl FileType {
    /// The `general.file_type` value.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The file type stored as `id`, if llama.cpp has one.
    pub fn from_id(id: u32) -> Option<FileType> {
        QUANT_OPTIONS
            .iter()
            .map(|o| o.ftype)
            .chain([FileType::NVFP4])
            .find(|t| t.id() == id)
    }

    /// The tensor type most tensors of a file of this type get (`llama_ftype_get_default_type`);
    /// `None` for a file type llama.cpp cannot quantize to (NVFP4).
    pub fn default_type(self) -> Option<DType> {
        use FileType as F;
        Some(match self {
            F::Q4_0 => DType::Q4_0,
            F::Q4_1 => DType::Q4_1,
            F::Q5_0 => DType::Q5_0,
            F::Q5_1 => DType::Q5_1,
            F::Q8_0 => DType::Q8_0,
            F::F16 => DType::F16,
            F::BF16 => DType::BF16,
            F::ALL_F32 => DType::F32,
            F::Q1_0 => DType::Q1_0,
            F::Q2_0 => DType::Q2_0,
            F::NVFP4 => return None,
            F::MXFP4_MOE => DType::MXFP4,
            F::Q2_K_S | F::Q2_K => DType::Q2_K,
            F::IQ3_XS => DType::IQ3_S,
            F::Q3_K_S | F::Q3_K_M | F::Q3_K_L => DType::Q3_K,
            F::Q4_K_S | F::Q4_K_M => DType::Q4_K,
            F::Q5_K_S | F::Q5_K_M => DType::Q5_K,
            F::Q6_K => DType::Q6_K,
            F::TQ1_0 => DType::TQ1_0,
            F::TQ2_0 => DType::TQ2_0,
            F::IQ2_XXS => DType::IQ2_XXS,
            F::IQ2_XS => DType::IQ2_XS,
            F::IQ2_S => DType::IQ2_XS,
            F::IQ2_M => DType::IQ2_S,
            F::IQ3_XXS => DType::IQ3_XXS,
            F::IQ1_S => DType::IQ1_S,
            F::IQ1_M => DType::IQ1_M,
            F::IQ4_NL => DType::IQ4_NL,
            F::IQ4_XS => DType::IQ4_XS,
            F::IQ3_S | F::IQ3_M => DType::IQ3_S,
        })
    }

    /// The file type llama.cpp guesses for a file without `general.file_type`, from the type
    /// most of its tensors have (`llama_model_loader`'s guess, without the GUESSED flag).
    pub fn guess_from(most_common: DType) -> u32 {
        use FileType as F;
        let ftype = match most_common {
            DType::F32 => F::ALL_F32,
            DType::F16 => F::F16,
            DType::BF16 => F::BF16,
            DType::Q4_0 => F::Q4_0,
            DType::Q4_1 => F::Q4_1,
            DType::Q5_0 => F::Q5_0,
            DType::Q5_1 => F::Q5_1,
            DType::Q8_0 => F::Q8_0,
            DType::Q2_K => F::Q2_K,
            DType::Q3_K => F::Q3_K_M,
            DType::Q4_K => F::Q4_K_M,
            DType::Q5_K => F::Q5_K_M,
            DType::Q6_K => F::Q6_K,
            DType::TQ1_0 => F::TQ1_0,
            DType::TQ2_0 => F::TQ2_0,
            DType::IQ2_XXS => F::IQ2_XXS,
            DType::IQ2_XS => F::IQ2_XS,
            DType::IQ2_S => F::IQ2_S,
            DType::IQ3_XXS => F::IQ3_XXS,
            DType::IQ1_S => F::IQ1_S,
            DType::IQ1_M => F::IQ1_M,
            DType::IQ4_NL => F::IQ4_NL,
            DType::IQ4_XS => F::IQ4_XS,
            DType::IQ3_S => F::IQ3_S,
            DType::MXFP4 => F::MXFP4_MOE,
            DType::NVFP4 => F::NVFP4,
            DType::Q1_0 => F::Q1_0,
            DType::Q2_0 => F::Q2_0,
            _ => F::ALL_F32,
        };
        ftype.id() | 1024
    }
}

/// The file type named `name` as llama-quantize reads its type argument: a name of
/// [`QUANT_OPTIONS`] (any case) or a file-type number. Returns the option's canonical name too.
pub fn parse_file_type(name: &str) -> Option<(FileType, &'static str)> {
    if let Some(o) = QUANT_OPTIONS
        .iter()
        .find(|o| o.name.eq_ignore_ascii_case(name))
    {
        return Some((o.ftype, o.name));
    }
    let id: u32 = name.trim().parse().ok()?;
    QUANT_OPTIONS
        .iter()
        .find(|o| o.ftype.id() == id)
        .map(|o| (o.ftype, o.name))
}

/// The tensor type named `name` (ggml's names, any case: `q4_K`, `F16`, `iq4_xs`), as
/// llama-quantize's `--output-tensor-type` and `--tensor-type` read it.
pub fn parse_tensor_type(name: &str) -> Option<DType> {
    DType::from_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers() {
        assert_eq!(
            parse_file_type("q4_k_m"),
            Some((FileType::Q4_K_M, "Q4_K_M"))
        );
        assert_eq!(parse_file_type("Q4_K"), Some((FileType::Q4_K_M, "Q4_K")));
        assert_eq!(parse_file_type("15"), Some((FileType::Q4_K_M, "Q4_K")));
        assert_eq!(parse_file_type("0"), Some((FileType::ALL_F32, "F32")));
        assert_eq!(parse_file_type("COPY"), Some((FileType::ALL_F32, "COPY")));
        assert_eq!(parse_file_type("Q4_3"), None);
        assert_eq!(parse_file_type("99"), None);
        assert_eq!(parse_tensor_type("Q6_k"), Some(DType::Q6_K));
        assert_eq!(FileType::from_id(39), Some(FileType::NVFP4));
        assert_eq!(FileType::IQ2_S.default_type(), Some(DType::IQ2_XS));
    }
}
