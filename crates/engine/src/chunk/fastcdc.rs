//! FastCDC-2020 (Xia et al., "The Design of Fast Content-Defined Chunking for Data
//! Deduplication Based Storage Systems", TPDS 2020): Gear rolling hash, cut-point skipping,
//! normalized chunking (level 2), and the paper's "rolling two bytes each time" taken to four
//! bytes per step.
//!
//! # Definition (what the golden vectors pin down)
//!
//! With `n = min(data.len(), max)`: if `n <= min` the chunk is `n` bytes long. Otherwise the
//! Gear hash starts at zero at byte `min - 1` and rolls `h = (h << 1) + GEAR[byte]` over the
//! bytes `i = min - 1, min, ...`; after byte `i` it tests the candidate chunk length `i + 1`:
//! the chunk ends there when `h & mask == 0`, where `mask` is [`FastCdc::mask_s`] (more bits,
//! so cuts are rarer) while `i + 1 < avg` and [`FastCdc::mask_l`] (fewer bits) from `avg` on.
//! If no candidate below `n` hits, the chunk is `n` bytes (`max`, or the end of the data).
//! Chunk lengths therefore lie in `min..=max` except for the last chunk of a stream, and
//! `cut` reads nothing past `data[..max]`. [`FastCdc::gear_table`] exposes the table so that
//! other implementations can reproduce the boundaries.
//!
//! The masks have `log2(avg) + 2` and `log2(avg) - 2` bits (normalization level 2), spread
//! evenly over hash bits 17..=60: the top bits of a Gear hash mix the most bytes (bit `k`
//! depends on the last `k + 1` bytes), and keeping bits 61..=63 clear lets the
//! four-bytes-per-step loop test intermediate hashes against `mask << 3`, `<< 2`, `<< 1`.
//!
//! # Speed
//!
//! Rolling several bytes per step: `h' = (h << 4) + (G[a] << 3) + (G[b] << 2) + (G[c] << 1) +
//! G[d]`, with the shifted tables precomputed, costs one shift per four bytes, and the partial
//! sums are the hashes after `a`, `b`, `c` shifted left by 3, 2, 1 (tested against shifted
//! masks). That is the paper's two-byte trick, generalized.
//!
//! The hash after 64 rolls no longer depends on where it started (`h << 64 == 0`). The fast
//! path uses that to scan a block as two independent lanes interleaved in one loop: lane 0
//! continues the running hash, lane 1 starts half a block further, warmed up over the 64
//! bytes before its start, so the CPU overlaps the two dependency chains. A hit in lane 0 is
//! the answer; a hit in lane 1 is the answer only after lane 0 has finished its half without
//! one. The result is exactly the sequential scan's (the unit tests check this against a
//! plain byte-at-a-time reference). Each phase (`MaskS` below `avg`, `MaskL` from `avg`) is
//! scanned on its own, so every position is tested with the mask for its position. Lanes
//! jump ahead in memory and cut-point skipping leaves gaps, which defeats the hardware
//! prefetcher, so the lanes prefetch a few KiB ahead of themselves.

use super::{config_error, Chunker, MAX_AVG_SIZE, MIN_AVG_SIZE};
use crate::Result;

/// The Gear table: 256 consecutive outputs of splitmix64 seeded with `0x6465_6475_7077_6972`
/// (the ASCII bytes `dedupwir`), frozen here so that chunk boundaries never change (a unit
/// test regenerates and compares it).
#[rustfmt::skip]
const GEAR: [u64; 256] = [
    0x1624_6a84_82e6_44f4, 0xf4fe_8a3e_96da_066b, 0xbd99_ead3_3c63_095e, 0xc31f_03d1_dc77_3357,
    0x49f2_7fee_87fd_5768, 0xe766_9525_49ce_4e00, 0xce0b_1529_802c_be4c, 0x7b8f_e6dc_650a_7528,
    0x54ab_8054_0b5e_9eea, 0x675d_419b_dab8_7fbd, 0x2a3f_1862_8d8c_7069, 0xe281_ee40_ff39_5abc,
    0xb536_d1e1_f600_9693, 0x7ef4_13d6_0f99_c266, 0x513d_b70f_ef07_9eb0, 0x7a66_015e_dea4_0258,
    0xbe63_2b54_847c_704f, 0x367d_5bd4_1439_e6be, 0x2bc0_ac5f_8ce2_fac8, 0xedb5_6853_4516_5aef,
    0x4bb7_e1ff_7079_1692, 0xe509_cc8e_4531_d2f9, 0xe80c_06aa_a07b_0d70, 0xe231_65d7_6444_cd24,
    0x3c4b_bb29_bc17_010f, 0x10b1_d4e1_4120_a833, 0x9519_ce69_a84d_39a0, 0x7e54_2cdc_9efc_d1a7,
    0xd6c8_12af_4534_2e82, 0xbc65_5d51_0e62_b544, 0x2e5c_227b_9b96_eac4, 0x31ef_9304_9c02_e6bd,
    0x4eed_a005_1c5f_a5e9, 0x718d_be65_cfe3_faeb, 0x7374_8fa0_09aa_4f3c, 0x20b2_6d42_0c20_52cb,
    0xf51e_f10d_5310_d9c4, 0xea7b_92b9_859d_c70f, 0x1d88_d6f5_66f6_354f, 0x6925_adf4_eda1_90e5,
    0x6ccc_5386_2593_cf07, 0x39c4_086c_c4cb_1aa1, 0x5c4d_2a3b_f4d8_dcf5, 0xa9ef_6509_a467_646f,
    0xcb80_4ebf_0217_74fb, 0xfd46_002a_c9b9_f00a, 0x185d_dfd6_32d2_d8c1, 0x40c7_6d9c_2ae8_2919,
    0x9860_20cd_50e6_8e2f, 0xb0e8_9f3a_c015_5c47, 0x64e0_3a3f_92af_4741, 0x7050_5619_fc6a_3d58,
    0x932e_78f8_df19_ad99, 0x7f72_6e92_2482_9f74, 0xe4bc_62ee_b090_8e91, 0xd5ea_1d19_8491_fe05,
    0x409b_fec8_53a5_d650, 0xb982_9b2a_76de_60c2, 0x4d42_150b_82a8_0d5c, 0x4f43_dae2_a740_6a08,
    0xf210_48ae_39dd_8378, 0xcd4e_86e8_b99e_06dc, 0xb28b_39f3_c8e7_0333, 0x9969_5496_e612_0318,
    0xd069_671c_8eea_fcb6, 0xb8e8_106f_8c13_4cd6, 0xfcbb_3301_c508_88e2, 0x00a2_a628_591f_5902,
    0x7337_fb43_15d1_30ea, 0x87c8_4571_c53a_bb43, 0x8ab5_6f38_ed53_7d9a, 0xf282_7b5d_4c36_9fa4,
    0x6457_7d4f_c9a9_de53, 0x2b6a_49a6_79da_d5b6, 0xf764_c445_aeb0_d77b, 0x6fe7_8237_e2bb_0e4c,
    0xa97b_e1fd_36c3_8c94, 0xacad_57f7_935b_4791, 0x7ec2_e87b_17f9_c29d, 0x10ce_ad0b_c82f_1cd0,
    0xcac2_83c0_cb7d_1878, 0x49d3_096c_df03_fb14, 0x8870_671b_2412_05fa, 0x3456_0a4d_737f_379e,
    0x6c72_3e7c_6bd3_e2b8, 0x5111_bee6_c3b1_efad, 0xfb19_3615_0a22_c029, 0x20bc_1a3d_bdb7_2c3a,
    0xac83_959d_e09f_8e7a, 0x8821_7fe8_8d45_df31, 0xc13d_eadf_9d79_a66a, 0x48ad_6f4a_9e38_d581,
    0x039c_ef4c_ccc9_d16b, 0x23e1_8a7e_7560_87df, 0x21a9_dafb_9ee1_85f4, 0x2938_fc4b_c61d_5df0,
    0xa9d8_18dc_9fdb_3271, 0xc096_cdc5_959c_a823, 0xe97d_770e_d9a5_9c58, 0xda3f_b40d_b7d3_622d,
    0x6704_8ea0_8f78_e661, 0x0129_a727_d5b2_409b, 0x019a_9f32_c02e_7479, 0xa961_c7ae_1715_2531,
    0xd556_da21_7c11_9ea9, 0xaaee_a386_745c_5fc2, 0x438a_63e4_a9ca_a21a, 0x0bd4_179f_c581_1e45,
    0x5d36_1397_bf70_4be5, 0xdf69_1280_4415_2305, 0xbc9e_c730_2bb0_490d, 0x3c3e_5f09_0ef7_4a73,
    0x603b_6fc2_c996_cd10, 0xc350_0668_3c18_dc2f, 0x4dd8_bacc_e72a_d0c8, 0x9f96_06ec_5e9c_c121,
    0x3a7c_8bc1_1fe7_98f1, 0x0641_f505_3fc2_8bad, 0x0e9b_2d3d_641f_718b, 0x82f4_f62c_9cbb_4e91,
    0x0014_223c_aae0_07f1, 0xbb08_85aa_0e9d_021d, 0xa579_b445_246c_e870, 0x0ceb_0ffe_931e_dfd5,
    0xd824_2f18_e020_7813, 0x4555_8436_dc17_08b5, 0x2a88_fea4_fb1b_bcce, 0xd831_34dd_59f2_98f9,
    0x80a6_d8fe_99cc_b163, 0x4441_7a9a_16ea_0415, 0x000d_806c_130b_22fc, 0x6e9f_66fe_3abe_1bf6,
    0x8616_fe2e_78e6_bc58, 0xc30d_95bf_fad5_6eae, 0x772f_a0b4_2e9c_6b67, 0x9652_97f5_7d8f_1a97,
    0x86fe_4920_ebd4_ebdd, 0x9ae8_bfb3_a067_2764, 0xa504_3d3e_e29e_be98, 0x28aa_25c7_f230_1c55,
    0xc3cb_9316_fb76_8f4d, 0x0395_e6d1_22e5_7a22, 0x8e40_b1ab_703a_53cf, 0x391b_e332_a8d0_04ea,
    0x7e57_7c45_63d4_d55d, 0x46f9_d3a2_b89e_944e, 0x6bfa_5925_801a_287a, 0x9f64_56a2_de1b_5edc,
    0x9482_1a34_0154_4192, 0xc40f_b72c_2fe5_415e, 0x2ff4_8c52_68ae_9755, 0xdb38_b84a_8c40_18d8,
    0x96f9_4db1_9774_1dbc, 0xf7b7_b217_0404_caaf, 0x3623_f803_8b9a_2e8d, 0xb9e6_3612_514a_189e,
    0xc964_a474_aa6a_a7ee, 0xf701_3a8b_7424_14cb, 0xaf09_0f5e_3eca_ae63, 0x2d19_70b3_5035_940e,
    0xf077_691b_447c_84ba, 0x9d6e_4ad4_0d1c_74de, 0xb164_ddf0_ddd6_0483, 0x018b_82b7_c68a_889b,
    0xdf39_5055_3ae1_9b06, 0x9639_a502_b68f_fbfe, 0xc7ca_2ad6_b51c_6164, 0x8747_a812_ffcd_14df,
    0xbcfc_7833_7d8a_d833, 0x0597_6ec9_8563_85a7, 0xca38_e4e1_71da_3a13, 0x48fd_f56e_96dd_2b41,
    0xf429_75ea_372d_eecf, 0x3fa8_9f69_ea50_689f, 0x0b91_938d_b411_086c, 0x118f_1b9b_a732_4a34,
    0x77ff_f256_bed7_bd79, 0xa3e4_25de_5e8c_faea, 0x9bd9_51ed_9335_dee5, 0xf26a_e5c7_c0e7_f7cc,
    0x4dd7_0e1d_2cb7_5424, 0xbff4_ddca_3c58_97cd, 0xd715_2956_9c04_b101, 0xf928_bde5_3152_0e9b,
    0x5727_8e84_093e_1aed, 0x1b3a_c08e_5fe8_47c9, 0x0513_edab_f030_fcb2, 0xbeb4_feda_1a65_329d,
    0xac38_2231_7f1a_315c, 0x9b6b_2a8d_5395_d9bf, 0xe962_9d53_b77c_e7f9, 0xa723_2687_5055_0b6a,
    0xb93d_464e_f2cb_1267, 0xb9d0_36ca_dcad_1955, 0xbc87_8d0d_eb62_1a3e, 0x5ef6_82eb_4bc5_59ad,
    0x13ae_62d5_f0c1_4212, 0x19f4_eb15_e482_5670, 0x60fe_9e32_d275_f84a, 0x37b3_221f_93af_f6db,
    0x7a5b_5cb3_0d44_5e02, 0x1e4f_a9ab_329e_cf76, 0xa988_eb1e_88a0_5f37, 0x366b_6e3c_1501_d8f0,
    0xacb1_dc23_9f3c_2adf, 0xbf85_7ee6_3508_982c, 0x6e1f_bbd3_cd40_b0ee, 0x493a_0e6b_7ef9_49b7,
    0xc49c_a760_5152_1b24, 0xf11f_0e47_90a6_fb9c, 0x2a19_298e_7499_979d, 0x311b_f074_c523_de90,
    0xf482_e405_c237_9ac3, 0x3875_0157_15a9_b8af, 0x4619_fca6_f34b_8151, 0x67f4_7f6d_f287_cefc,
    0x1d13_4a3b_8ba5_25d5, 0x19cf_4efd_51f2_47cb, 0xbb4e_be86_c6d1_0aa9, 0xbd22_d2e3_fc1d_5e33,
    0xbd27_ad49_5151_c413, 0x6b45_39c5_3354_9a6f, 0xf2bd_6caf_b90d_7880, 0x46d4_68cc_29d8_147c,
    0x0681_9288_506b_2af2, 0x4dd2_eef7_9394_4d65, 0x9ecd_5072_1f67_7481, 0x2e07_99cb_21e8_92b4,
    0x58f8_df68_ca3b_fe0e, 0x4d4a_a67f_d584_0dbc, 0x3cff_3b21_0565_4c91, 0xf33e_058a_18c6_0759,
    0x6b58_7efb_097d_0758, 0xe737_578a_2b19_a123, 0x2e6c_e44c_c7e8_145d, 0x9a96_1f84_9e85_81a9,
    0x46b6_9053_4e23_9b10, 0x867c_2106_33cc_1c83, 0x5a67_9917_2d44_a8ee, 0x889e_a5d2_3505_4311,
    0x481f_db44_2126_f181, 0xe330_957b_68d7_e561, 0x1f71_d234_2cb0_6e46, 0x7402_eb45_9e63_981c,
    0x679b_075d_05df_4c9e, 0x393f_c752_1c5a_8d11, 0xefdc_df5c_e2cb_0a42, 0xc541_22d0_cef0_4551,
    0xbf56_452b_9f9c_2d96, 0x682f_d743_0c99_ded5, 0x1815_b957_f7c6_be87, 0x30b8_600f_a213_918e,
    0x0cd9_814a_5132_f262, 0x8fcc_9a58_7645_2374, 0x994a_cb83_098f_f7a7, 0x439b_1864_b1a1_1e91,
];

/// [`GEAR`] shifted left by 3, 2, 1 and 0 bits, for rolling four bytes per step.
static GEAR4: [[u64; 256]; 4] = shifted4(&GEAR);

/// A Gear table shifted left by 3, 2, 1 and 0 bits: four Gear steps from `h` become `h << 4`
/// plus one entry per byte, each partial sum being the hash after that byte shifted left by
/// 3, 2, 1 and 0.
pub(crate) const fn shifted4(gear: &[u64; 256]) -> [[u64; 256]; 4] {
    let mut t = [[0u64; 256]; 4];
    let mut i = 0;
    while i < 256 {
        t[0][i] = gear[i] << 3;
        t[1][i] = gear[i] << 2;
        t[2][i] = gear[i] << 1;
        t[3][i] = gear[i];
        i += 1;
    }
    t
}

/// Normalization level: `MaskS` has `log2(avg) + NC` bits, `MaskL` has `log2(avg) - NC`.
const NC: u32 = 2;

/// Lowest hash bit a mask may use.
const MASK_LOW_BIT: u32 = 17;
/// Highest hash bit a mask may use (bits 61..=63 stay clear, see the module docs).
const MASK_HIGH_BIT: u32 = 60;

/// A mask of `bits` one-bits spread evenly over hash bits `MASK_LOW_BIT..=MASK_HIGH_BIT`,
/// starting at the top.
const fn spread_mask(bits: u32) -> u64 {
    let span = MASK_HIGH_BIT - MASK_LOW_BIT; // 43: bits 60, 60 - 43/n, ...
    let mut m = 0u64;
    let mut j = 0;
    while j < bits {
        m |= 1u64 << (MASK_HIGH_BIT - j * span / bits);
        j += 1;
    }
    m
}

/// Bytes of history that make a lane's hash independent of where it started.
const WARMUP: usize = 64;
/// Shortest lane worth the 64-byte warm-up; shorter ranges are scanned sequentially.
const MIN_LANE: usize = 256;
/// How far ahead of each lane to prefetch, in bytes.
const PREFETCH: usize = 4096;
/// Cache line size assumed by the prefetching.
const LINE: usize = 64;

/// FastCDC-2020 content-defined chunker with normalized chunking.
#[derive(Debug, Clone)]
pub struct FastCdc {
    min: usize,
    avg: usize,
    max: usize,
    mask_s: u64,
    mask_l: u64,
    /// Lane length (a multiple of 64, or 0 for sequential) for the `MaskL` phase.
    lane_l: usize,
}

impl FastCdc {
    /// Largest accepted `max` (1 GiB): a stream chunker buffers `max` bytes.
    pub const MAX_LEN_LIMIT: usize = 1 << 30;

    /// A chunker with the given sizes: `MIN_AVG_SIZE <= avg <= MAX_AVG_SIZE`, `min <= avg <= max`.
    ///
    /// `avg` must be a power of two, `min` at least 1 and `max` at most
    /// [`FastCdc::MAX_LEN_LIMIT`]; anything else is an [`Error::Config`](crate::Error::Config).
    pub fn new(min: usize, avg: usize, max: usize) -> Result<Self> {
        if !avg.is_power_of_two() || !(MIN_AVG_SIZE..=MAX_AVG_SIZE).contains(&avg) {
            return Err(config_error(format!(
                "CDC average chunk size must be a power of two from {MIN_AVG_SIZE} to \
                 {MAX_AVG_SIZE} bytes, got {avg}"
            )));
        }
        if min == 0 || min > avg {
            return Err(config_error(format!(
                "CDC minimum chunk size must be from 1 to the average ({avg}) bytes, got {min}"
            )));
        }
        if max < avg || max > Self::MAX_LEN_LIMIT {
            return Err(config_error(format!(
                "CDC maximum chunk size must be from the average ({avg}) to {} bytes, got {max}",
                Self::MAX_LEN_LIMIT
            )));
        }
        let bits = avg.trailing_zeros();
        // Expected distance between MaskL hits is mu = 2^(bits - NC). Two lanes of length L
        // cost about L/4 (lane 1's work after a lane-0 hit) + 64 per block (warm-up); the
        // total over a hit is smallest near L = 16 * sqrt(mu) (a multiple of 64 here). Below
        // 8 KiB average the overhead eats the gain and the sequential loop is used.
        let mu = 1usize << (bits - NC);
        let lane_l = if mu >= 2048 {
            16 * (1usize << ((bits - NC) / 2))
        } else {
            0
        };
        Ok(FastCdc {
            min,
            avg,
            max,
            mask_s: spread_mask(bits + NC),
            mask_l: spread_mask(bits - NC),
            lane_l,
        })
    }

    /// The minimum chunk length (every chunk but the last is at least this long).
    pub fn min_len(&self) -> usize {
        self.min
    }

    /// The target average chunk length (the normalization point).
    pub fn avg_len(&self) -> usize {
        self.avg
    }

    /// The harder mask, tested for candidate lengths below the average.
    pub fn mask_s(&self) -> u64 {
        self.mask_s
    }

    /// The easier mask, tested for candidate lengths from the average on.
    pub fn mask_l(&self) -> u64 {
        self.mask_l
    }

    /// The frozen Gear table, for other implementations that must find the same boundaries.
    pub fn gear_table() -> &'static [u64; 256] {
        &GEAR
    }

    /// The Gear table shifted left by 3, 2, 1 and 0 bits, for scans that roll four bytes per
    /// step with one addition per byte (see [`FastCdc::gear_table`]).
    pub fn gear4_table() -> &'static [[u64; 256]; 4] {
        &GEAR4
    }

    /// The cut, computed by the fast path: two lanes where a range is long enough, else
    /// sequential, four bytes per step either way.
    fn cut_fast(&self, data: &[u8]) -> usize {
        let n = data.len().min(self.max);
        if n <= self.min {
            return n;
        }
        // Candidate positions are [start, end): testing byte n - 1 would not change the answer.
        let start = self.min - 1;
        let end = n - 1;
        let mid = (self.avg - 1).clamp(start, end);
        let data = &data[..end];
        let h = match scan_s(data, start, mid, self.mask_s) {
            Ok(i) => return i + 1,
            Err(h) => h,
        };
        let found = if self.lane_l != 0 {
            scan_lanes(data, mid, end, h, self.mask_l, self.lane_l)
        } else {
            scan_seq(data, mid, end, h, self.mask_l)
        };
        match found {
            Ok(i) => i + 1,
            Err(_) => n,
        }
    }
}

impl Chunker for FastCdc {
    fn cut(&self, data: &[u8]) -> usize {
        self.cut_fast(data)
    }
    fn max_len(&self) -> usize {
        self.max
    }
}

/// A scan's outcome: `Ok(i)` if position `i` is the first hit, else `Err(hash)` after the range.
type Scan = std::result::Result<usize, u64>;

/// A mask and its shifts, for testing the partial sums of a four-byte step.
#[derive(Clone, Copy)]
struct Masks {
    m3: u64,
    m2: u64,
    m1: u64,
    m0: u64,
}

impl Masks {
    #[inline(always)]
    fn new(mask: u64) -> Self {
        debug_assert_eq!(mask >> (MASK_HIGH_BIT + 1), 0);
        Masks {
            m3: mask << 3,
            m2: mask << 2,
            m1: mask << 1,
            m0: mask,
        }
    }
}

/// Rolls and tests four positions after hash `h`: `Ok(k)` for a hit at the `k`-th byte,
/// else `Err(hash after the four bytes)`.
#[inline(always)]
fn step4(h: u64, q: &[u8; 4], m: &Masks) -> Scan {
    let g = &GEAR4;
    // (h << 4) + (G[a] << 3) == (hash after a) << 3, and so on: test with shifted masks
    // (the mask's top three bits are clear, so the shifts lose nothing).
    let x = (h << 4).wrapping_add(g[0][q[0] as usize]);
    if x & m.m3 == 0 {
        return Ok(0);
    }
    let x = x.wrapping_add(g[1][q[1] as usize]);
    if x & m.m2 == 0 {
        return Ok(1);
    }
    let x = x.wrapping_add(g[2][q[2] as usize]);
    if x & m.m1 == 0 {
        return Ok(2);
    }
    let x = x.wrapping_add(g[3][q[3] as usize]);
    if x & m.m0 == 0 {
        return Ok(3);
    }
    Err(x)
}

/// The four bytes at `data[at..at + 4]`.
///
/// # Safety
///
/// `at + 4 <= data.len()`.
#[inline(always)]
unsafe fn quad(data: &[u8], at: usize) -> &[u8; 4] {
    debug_assert!(at + 4 <= data.len());
    // SAFETY: in bounds by the caller's promise; [u8; 4] has alignment 1.
    unsafe { &*data.as_ptr().add(at).cast::<[u8; 4]>() }
}

/// The `MaskS` phase `[start, end)`, with the hash starting at zero: one two-lane block over
/// the whole phase (hits are rare here, about one chunk in six), else sequential.
#[inline]
fn scan_s(data: &[u8], start: usize, end: usize, mask: u64) -> Scan {
    let lane = ((end - start) / 2) & !(LINE - 1);
    if lane >= MIN_LANE {
        scan_lanes(data, start, end, 0, mask, lane)
    } else {
        scan_seq(data, start, end, 0, mask)
    }
}

/// Rolls and tests positions `[i, end)` one after the other, four bytes per step.
///
/// `h` is the hash after position `i - 1`. Position `p` is a hit when the hash after
/// rolling `data[p]` has no bit of `mask` set.
#[inline]
fn scan_seq(data: &[u8], mut i: usize, end: usize, mut h: u64, mask: u64) -> Scan {
    assert!(end <= data.len());
    let m = Masks::new(mask);
    while i + 4 <= end {
        // SAFETY: i + 4 <= end <= data.len().
        match step4(h, unsafe { quad(data, i) }, &m) {
            Ok(k) => return Ok(i + k),
            Err(x) => h = x,
        }
        i += 4;
    }
    while i < end {
        h = (h << 1).wrapping_add(GEAR[data[i] as usize]);
        if h & mask == 0 {
            return Ok(i);
        }
        i += 1;
    }
    Err(h)
}

/// Hash after rolling the 64 bytes `data[at..at + 64]` from zero: equal to the hash of any
/// longer run ending at the same byte.
#[inline(always)]
fn warm_up(data: &[u8], at: usize) -> u64 {
    let g = &GEAR4;
    let mut h = 0u64;
    for q in data[at..at + WARMUP].chunks_exact(4) {
        h = (h << 4)
            .wrapping_add(g[0][q[0] as usize])
            .wrapping_add(g[1][q[1] as usize])
            .wrapping_add(g[2][q[2] as usize])
            .wrapping_add(g[3][q[3] as usize]);
    }
    h
}

/// Same result as [`scan_seq`], faster: blocks of `2 * lane` positions are scanned as two
/// interleaved lanes. Needs `lane % 64 == 0`, `lane >= WARMUP`, and `h` must be the true hash
/// after position `i - 1` (zero if `i` is where hashing starts).
#[inline]
fn scan_lanes(data: &[u8], mut i: usize, end: usize, mut h: u64, mask: u64, lane: usize) -> Scan {
    assert!(end <= data.len() && lane.is_multiple_of(LINE) && lane >= WARMUP);
    let m = Masks::new(mask);
    while end - i >= 2 * lane {
        // Lane 1 starts at i + lane; its 64 bytes of warm-up lie inside [i, i + lane), after
        // the start of hashing, so its hash equals the sequential one from its first byte.
        for k in (0..PREFETCH + LINE).step_by(LINE) {
            crate::hint::prefetch(data, i + k);
            crate::hint::prefetch(data, i + lane - WARMUP + k);
        }
        let mut h1 = warm_up(data, i + lane - WARMUP);
        let mut h0 = h;
        let (d0, d1) = (&data[i..i + lane], &data[i + lane..i + 2 * lane]);
        let mut j = 0;
        while j < lane {
            if j % LINE == 0 {
                crate::hint::prefetch(d0, j + PREFETCH);
                crate::hint::prefetch(d1, j + PREFETCH);
            }
            // SAFETY: j + 8 <= lane == d0.len() == d1.len() (lane is a multiple of 8).
            let (q0, q1, r0, r1) =
                unsafe { (quad(d0, j), quad(d1, j), quad(d0, j + 4), quad(d1, j + 4)) };
            // Lane 0's step, then lane 1's: the CPU overlaps the two chains.
            match step4(h0, q0, &m) {
                Ok(k) => return Ok(i + j + k),
                Err(x) => h0 = x,
            }
            match step4(h1, q1, &m) {
                Ok(k) => {
                    return Ok(lane1_hit(
                        data,
                        i + j + 4,
                        i + lane,
                        h0,
                        mask,
                        i + lane + j + k,
                    ))
                }
                Err(x) => h1 = x,
            }
            match step4(h0, r0, &m) {
                Ok(k) => return Ok(i + j + 4 + k),
                Err(x) => h0 = x,
            }
            match step4(h1, r1, &m) {
                Ok(k) => {
                    let hit = i + lane + j + 4 + k;
                    return Ok(lane1_hit(data, i + j + 8, i + lane, h0, mask, hit));
                }
                Err(x) => h1 = x,
            }
            j += 8;
        }
        h = h1;
        i += 2 * lane;
    }
    scan_seq(data, i, end, h, mask)
}

/// Lane 1 hit at `hit`, and lane 0 has tested its positions before `from` without a hit
/// (`h0` is its hash there): the first hit is lane 0's in `[from, lane0_end)`, if any.
#[cold]
#[inline(never)]
fn lane1_hit(data: &[u8], from: usize, lane0_end: usize, h0: u64, mask: u64, hit: usize) -> usize {
    scan_seq(data, from, lane0_end, h0, mask).unwrap_or(hit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::chunks;

    /// The definition, byte at a time: the oracle for the fast path.
    fn cut_reference(c: &FastCdc, data: &[u8]) -> usize {
        let n = data.len().min(c.max);
        if n <= c.min {
            return n;
        }
        let mut h = 0u64;
        for (i, &b) in data.iter().enumerate().take(n - 1).skip(c.min - 1) {
            h = (h << 1).wrapping_add(GEAR[b as usize]);
            let mask = if i + 1 < c.avg { c.mask_s } else { c.mask_l };
            if h & mask == 0 {
                return i + 1;
            }
        }
        n
    }

    /// Seed of the splitmix64 sequence that generated [`GEAR`] (the ASCII bytes `dedupwir`).
    const GEAR_SEED: u64 = 0x6465_6475_7077_6972;

    fn splitmix64(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&splitmix64(&mut s).to_le_bytes());
        }
        v.truncate(n);
        v
    }

    /// Bytes from a small alphabet with long runs: many near-hits, long scans, repeats.
    fn low_entropy_bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        let mut v = Vec::with_capacity(n);
        while v.len() < n {
            let r = splitmix64(&mut s);
            let run = 1 + (r % 200) as usize;
            let byte = b"aaab\n {}"[(r >> 32) as usize % 8];
            v.resize(v.len() + run.min(n - v.len()), byte);
        }
        v
    }

    fn all_cuts_agree(c: &FastCdc, data: &[u8]) {
        let mut off = 0;
        while off < data.len() {
            let rest = &data[off..];
            let want = cut_reference(c, rest);
            let got = c.cut(rest);
            assert_eq!(got, want, "{c:?} at offset {off} of {}", data.len());
            off += got;
        }
    }

    #[test]
    fn gear_table_is_the_seeded_splitmix64_sequence() {
        let mut s = GEAR_SEED;
        for (i, &g) in GEAR.iter().enumerate() {
            assert_eq!(g, splitmix64(&mut s), "GEAR[{i}]");
        }
        assert_eq!(&GEAR_SEED.to_be_bytes(), b"dedupwir");
    }

    #[test]
    fn masks_have_the_normalized_bit_counts() {
        for bits in 6..=23u32 {
            let c = FastCdc::new(1, 1 << bits, 1 << bits).unwrap();
            assert_eq!(c.mask_s().count_ones(), bits + 2);
            assert_eq!(c.mask_l().count_ones(), bits - 2);
            for m in [c.mask_s(), c.mask_l()] {
                assert_eq!(m >> 61, 0, "bits 61..=63 must stay clear");
                assert_eq!(m & ((1 << MASK_LOW_BIT) - 1), 0);
            }
        }
        // Spot-check the layout: 8 KiB average -> 15 and 11 bits.
        let c = FastCdc::new(2048, 8192, 65536).unwrap();
        assert_eq!(c.mask_s(), 0x1492_4949_2490_0000);
        assert_eq!(c.mask_l(), 0x1222_2222_2220_0000);
    }

    #[test]
    fn bad_parameters_are_config_errors() {
        let bad = [
            (0, 64, 64),
            (65, 64, 128),
            (1, 63, 64),
            (1, 96, 128),
            (1, 32, 64),
            (1, MAX_AVG_SIZE * 2, MAX_AVG_SIZE * 2),
            (16, 64, 63),
            (16, 64, FastCdc::MAX_LEN_LIMIT + 1),
        ];
        for (min, avg, max) in bad {
            match FastCdc::new(min, avg, max) {
                Err(crate::Error::Config(msg)) => assert!(msg.contains("CDC"), "{msg}"),
                other => panic!("({min}, {avg}, {max}) gave {other:?}"),
            }
        }
        assert!(FastCdc::new(1, 64, 64).is_ok());
        assert!(FastCdc::new(MAX_AVG_SIZE, MAX_AVG_SIZE, MAX_AVG_SIZE).is_ok());
    }

    #[test]
    fn fast_path_equals_reference_on_random_data() {
        let data = random_bytes(3 << 20, 1);
        let low = low_entropy_bytes(1 << 20, 2);
        for (min, avg, max) in [
            (2048, 8192, 65536),
            (1, 8192, 65536),
            (16, 64, 256),
            (1, 64, 64),
            (64, 256, 1024),
            (256, 1024, 4096),
            (1, 1024, 1 << 20),
            (4096, 16384, 65536),
            (16384, 65536, 262_144),
            (8192, 65536, 65536),
            (65536, 65536, 1 << 20),
            (3, 4096, 5000),
            (1 << 18, 1 << 20, 1 << 22),
        ] {
            let c = FastCdc::new(min, avg, max).unwrap();
            all_cuts_agree(&c, &data);
            all_cuts_agree(&c, &low);
        }
    }

    #[test]
    fn fast_path_equals_reference_on_random_configs() {
        let mut s = 99u64;
        let data = random_bytes(1 << 20, 3);
        let low = low_entropy_bytes(1 << 19, 4);
        for _ in 0..60 {
            let bits = 6 + (splitmix64(&mut s) % 12) as u32;
            let avg = 1usize << bits;
            let min = 1 + (splitmix64(&mut s) as usize % avg);
            let max = avg + (splitmix64(&mut s) as usize % (avg * 8));
            let c = FastCdc::new(min, avg, max).unwrap();
            let off = splitmix64(&mut s) as usize % 4096;
            all_cuts_agree(&c, &data[off..]);
            all_cuts_agree(&c, &low[off..]);
        }
    }

    /// Bytes on which the definition finds no cut at all before `len`: after the first
    /// `min - 1` bytes, each byte is the smallest that keeps the hash off its mask.
    fn no_hit_bytes(c: &FastCdc, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        let mut h = 0u64;
        for (i, slot) in v.iter_mut().enumerate().skip(c.min - 1) {
            let mask = if i + 1 < c.avg { c.mask_s } else { c.mask_l };
            let b = (0..=255u8)
                .find(|&b| ((h << 1).wrapping_add(GEAR[b as usize])) & mask != 0)
                .unwrap();
            *slot = b;
            h = (h << 1).wrapping_add(GEAR[b as usize]);
        }
        v
    }

    #[test]
    fn boundary_lengths_agree_with_reference() {
        // Every length around min, avg, max and the lane / warm-up edges, on data with no cut
        // (so the scan runs to the end and every tail and edge case is taken) and on random
        // data.
        let rand = random_bytes(1 << 17, 5);
        for (min, avg, max) in [
            (2048, 8192, 65536),
            (1, 64, 200),
            (100, 4096, 4200),
            (5, 16384, 70_001),
        ] {
            let c = FastCdc::new(min, avg, max).unwrap();
            let none = no_hit_bytes(&c, max + 300);
            assert_eq!(cut_reference(&c, &none), max);
            let mut lens: Vec<usize> = (0..130).collect();
            for p in [
                min,
                avg,
                max,
                avg - min,
                min + 2 * MIN_LANE,
                (avg - min) / 2,
                avg + 2 * c.lane_l,
                avg + 4 * c.lane_l,
            ] {
                for d in 0..=2 * WARMUP + 8 {
                    lens.push(p.saturating_sub(d));
                    lens.push(p + d);
                }
            }
            for len in lens {
                for data in [&none, &rand] {
                    let d = &data[..len.min(data.len())];
                    assert_eq!(c.cut(d), cut_reference(&c, d), "{c:?} len {len}");
                }
            }
        }
    }

    #[test]
    fn lanes_equal_sequential_for_dense_and_sparse_hits() {
        // Masks from "every byte hits" to "one in 4096": hits land in lane 0, in lane 1, in
        // both, at every offset from the lane edges, and in the sequential tail.
        let data = random_bytes(8 * MIN_LANE + 300, 7);
        for bits in [0, 1, 2, 3, 4, 6, 8, 9, 10, 12] {
            let mask = if bits == 0 { 0 } else { spread_mask(bits) };
            for start in 0..9 {
                for end in [2 * MIN_LANE, 2 * MIN_LANE + 1, 4 * MIN_LANE + 3, data.len()] {
                    for lane in [MIN_LANE, MIN_LANE + LINE, 2 * MIN_LANE] {
                        let a = scan_seq(&data, start, end, 0, mask);
                        let b = scan_lanes(&data, start, end, 0, mask, lane);
                        assert_eq!(a, b, "bits {bits} start {start} end {end} lane {lane}");
                        // A nonzero incoming hash too (the MaskL phase continues one).
                        let a = scan_seq(&data, start + 64, end, 0x1234_5678_9abc_def0, mask);
                        let b =
                            scan_lanes(&data, start + 64, end, 0x1234_5678_9abc_def0, mask, lane);
                        assert_eq!(a, b, "bits {bits} start {start} end {end} lane {lane} (h)");
                    }
                }
            }
        }
    }

    #[test]
    fn every_chunk_within_bounds() {
        let data = random_bytes(1 << 20, 11);
        let c = FastCdc::new(1024, 4096, 16384).unwrap();
        let lens: Vec<usize> = chunks(&c, &data).map(<[u8]>::len).collect();
        assert_eq!(lens.iter().sum::<usize>(), data.len());
        let (last, body) = lens.split_last().unwrap();
        assert!(body.iter().all(|&l| (1024..=16384).contains(&l)));
        assert!(*last <= 16384);
    }

    #[test]
    fn tiny_min_works() {
        let data = random_bytes(100_000, 12);
        for min in [1, 2, 3, 63] {
            let c = FastCdc::new(min, 64, 256).unwrap();
            all_cuts_agree(&c, &data);
            assert!(chunks(&c, &data).all(|ch| !ch.is_empty() && ch.len() <= 256));
        }
        // Whole-range degenerate config: min == avg == max is fixed-size.
        let c = FastCdc::new(64, 64, 64).unwrap();
        assert!(chunks(&c, &data).take(1000).all(|ch| ch.len() == 64));
        assert_eq!(c.cut(&[]), 0);
        assert_eq!(c.cut(&[9]), 1);
    }

    #[test]
    fn cut_reads_only_the_first_max_bytes() {
        let data = random_bytes(70_000, 13);
        let c = FastCdc::new(64, 1024, 4096).unwrap();
        let mut off = 0;
        while off + 4096 < data.len() {
            let a = c.cut(&data[off..]);
            let b = c.cut(&data[off..off + 4096]);
            assert_eq!(a, b);
            off += a;
        }
    }
}
