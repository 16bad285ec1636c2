//! The gRPC codec of the `echomq.v1` services: tonic's prost codec with
//! smaller first buffers.
//!
//! tonic allocates a decode buffer and an encode buffer for every call when
//! it starts, 8 KiB each by default, and keeps them for the life of the call.
//! A Consume call lives as long as its subscriber, and an idle one holds
//! nothing else of that size: in a heap profile of 1,000 idle subscriptions
//! the two buffers were 16 KB of the 80 KB each cost. Both buffers grow to
//! the message at hand (the decode buffer reserves a whole message at once,
//! the encode buffer doubles), so a smaller start costs a reallocation only
//! for messages larger than it.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// Each call's first decode and encode buffers (bytes): a verdict, a
/// `Subscribed` or a small delivery fits.
pub const BUFFER_BYTES: usize = 1024;
/// Encoded messages gathered into one write (bytes): tonic's default.
pub const YIELD_THRESHOLD_BYTES: usize = 32 * 1024;

/// [`tonic_prost::ProstCodec`] with [`BUFFER_BYTES`] first buffers; the
/// generated services and clients use it (`build.rs`).
#[derive(Debug)]
pub struct LeanCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for LeanCodec<T, U> {
    fn default() -> Self {
        LeanCodec(PhantomData)
    }
}

impl<T, U> Codec for LeanCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(settings())
    }
}

fn settings() -> BufferSettings {
    BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD_BYTES)
}
