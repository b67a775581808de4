//! Parameter counts and forward shapes of the models, on the CPU (Flex) backend.

use burn::backend::Flex;
use burn::module::Module;
use burn::tensor::{Distribution, Tensor};
use burn_models::{
    BlockKind, MobileNetConfig, MobileNetError, ResNetConfig, ResNetError, RunContext,
    SimpleModelConfig, Stem,
};

type B = Flex;

#[test]
fn simple_model_has_the_articles_parameter_count() {
    // 3·64·9 + 64 (conv) + 64·16·16·10 + 10 (linear)
    let model = SimpleModelConfig::new().init::<B>(&Default::default());
    assert_eq!(model.trainable_params(), 165_642);
}

#[test]
fn simple_model_forward_shape() {
    let device = Default::default();
    let model = SimpleModelConfig::new().init::<B>(&device);
    let x = Tensor::<B, 4>::random([5, 3, 32, 32], Distribution::Default, &device);
    assert_eq!(model.forward(x, &RunContext::default()).dims(), [5, 10]);
}

/// Table 6 of Howard et al. (224×224, 1000 classes): millions of parameters per α.
#[test]
fn mobilenet_parameter_counts_match_the_paper() {
    for (alpha, millions) in [(1.0, 4.2), (0.75, 2.6), (0.5, 1.3), (0.25, 0.5)] {
        let config = MobileNetConfig::new().with_width_multiplier(alpha);
        let params = config
            .init::<B>(&Default::default())
            .unwrap()
            .trainable_params();
        let rounded = (params as f64 / 1e5).round() / 10.0;
        assert_eq!(rounded, millions, "α = {alpha}: {params} parameters");
    }
}

/// Keras' `MobileNet(alpha=1.0)` (same layout, bias-free convs) reports 4,253,864 params in
/// all, 4,231,976 trainable; the 21,888 others are the batch norms' running mean and variance.
#[test]
fn mobilenet_exact_count_matches_keras() {
    let model = MobileNetConfig::new()
        .init::<B>(&Default::default())
        .unwrap();
    assert_eq!(model.trainable_params(), 4_231_976);
    assert_eq!(model.num_params(), 4_253_864);
}

#[test]
fn mobilenet_forward_shapes() {
    let device = Default::default();
    let cifar = MobileNetConfig::cifar().with_width_multiplier(0.25);
    let model = cifar.init::<B>(&device).unwrap();
    let x = Tensor::<B, 4>::random([2, 3, 32, 32], Distribution::Default, &device);
    assert_eq!(model.forward(x, &RunContext::default()).dims(), [2, 10]);

    let imagenet = MobileNetConfig::new()
        .with_width_multiplier(0.25)
        .with_num_classes(7);
    let model = imagenet.init::<B>(&device).unwrap();
    let x = Tensor::<B, 4>::random([1, 3, 96, 96], Distribution::Default, &device);
    assert_eq!(model.forward(x, &RunContext::default()).dims(), [1, 7]);
}

#[test]
fn mobilenet_rejects_bad_configs() {
    let device = Default::default();
    let bad = MobileNetConfig::new().with_width_multiplier(0.0);
    assert_eq!(
        bad.init::<B>(&device).unwrap_err(),
        MobileNetError::WidthMultiplier(0.0)
    );
    let bad = MobileNetConfig::new().with_stem_stride(3);
    assert_eq!(
        bad.validate().unwrap_err().to_string(),
        "stem_stride must be 1 or 2, got 3"
    );
}

/// torchvision's counts at 224×224 and 1000 classes: weights and batch-norm γ, β, not the
/// running statistics (PyTorch:
/// `[sum(p.numel() for p in f().parameters()) for f in (resnet18, resnet34, resnet50)]`).
#[test]
fn resnet_parameter_counts_match_torchvision() {
    for (depth, count) in [(18, 11_689_512), (34, 21_797_672), (50, 25_557_032)] {
        let model = ResNetConfig::new()
            .with_depth(depth)
            .init::<B>(&Default::default())
            .unwrap();
        assert_eq!(model.trainable_params(), count, "ResNet-{depth}");
    }
}

/// The block list `init` builds from (and an estimate walks): torchvision's module names,
/// and a downsample exactly where the stride or the channels change.
#[test]
fn resnet_block_lists() {
    let blocks = ResNetConfig::new().with_depth(50).blocks().unwrap();
    assert_eq!(blocks.len(), 3 + 4 + 6 + 3);
    let names: Vec<_> = blocks.iter().map(|b| b.name).collect();
    assert_eq!(
        &names[..4],
        ["layer1.0", "layer1.1", "layer1.2", "layer2.0"]
    );
    assert_eq!(names[15], "layer4.2");
    assert!(blocks.iter().all(|b| b.kind == BlockKind::Bottleneck));
    // layer1.0 widens 64 → 256 at stride 1; every other stage's first block strides.
    let downsampled: Vec<_> = blocks
        .iter()
        .filter(|b| b.downsample())
        .map(|b| b.name)
        .collect();
    assert_eq!(
        downsampled,
        ["layer1.0", "layer2.0", "layer3.0", "layer4.0"]
    );
    let last = blocks.last().unwrap();
    assert_eq!(
        (last.c_in, last.width, last.c_out, last.stride),
        (2048, 512, 2048, 1)
    );

    let blocks = ResNetConfig::cifar()
        .with_width_multiplier(0.25)
        .blocks()
        .unwrap();
    assert_eq!(blocks.len(), 8);
    let downsampled: Vec<_> = blocks
        .iter()
        .filter(|b| b.downsample())
        .map(|b| b.name)
        .collect();
    assert_eq!(downsampled, ["layer2.0", "layer3.0", "layer4.0"]);
    let widths: Vec<_> = blocks.iter().map(|b| (b.c_in, b.c_out, b.stride)).collect();
    assert_eq!(
        widths,
        [
            (16, 16, 1),
            (16, 16, 1),
            (16, 32, 2),
            (32, 32, 1),
            (32, 64, 2),
            (64, 64, 1),
            (64, 128, 2),
            (128, 128, 1)
        ]
    );
}

#[test]
fn resnet_forward_shapes() {
    let device = Default::default();
    // 512·α channels out of the last basic block, four times that out of a bottleneck.
    for (depth, channels) in [(18, 128), (50, 512)] {
        let cifar = ResNetConfig::cifar()
            .with_depth(depth)
            .with_width_multiplier(0.25);
        let model = cifar.init::<B>(&device).unwrap();
        let x = Tensor::<B, 4>::random([2, 3, 32, 32], Distribution::Default, &device);
        let features = model.features(x.clone(), &RunContext::default());
        assert_eq!(features.dims(), [2, channels, 4, 4], "ResNet-{depth}");
        assert_eq!(model.forward(x, &RunContext::default()).dims(), [2, 10]);
    }

    // 7×7/2 and max-pool 3×3/2 (padded): 72 → 36 → 18, then 9, 5, 3.
    let imagenet = ResNetConfig::new()
        .with_width_multiplier(0.125)
        .with_input_size(72)
        .with_num_classes(7);
    let model = imagenet.init::<B>(&device).unwrap();
    let x = Tensor::<B, 4>::random([1, 3, 72, 72], Distribution::Default, &device);
    let features = model.features(x.clone(), &RunContext::default());
    assert_eq!(features.dims(), [1, 64, 3, 3]);
    assert_eq!(model.forward(x, &RunContext::default()).dims(), [1, 7]);
}

#[test]
fn resnet_rejects_bad_configs() {
    let device = Default::default();
    let bad = ResNetConfig::new().with_depth(101);
    assert_eq!(bad.init::<B>(&device).unwrap_err(), ResNetError::Depth(101));
    assert_eq!(bad.blocks().unwrap_err(), ResNetError::Depth(101));
    let bad = ResNetConfig::new().with_width_multiplier(-0.5);
    assert_eq!(
        bad.validate().unwrap_err(),
        ResNetError::WidthMultiplier(-0.5)
    );
    let bad = ResNetConfig::new().with_width_multiplier(f64::NAN);
    assert!(matches!(
        bad.validate(),
        Err(ResNetError::WidthMultiplier(_))
    ));
    // 16 is enough for the 3×3 stem, not for the imagenet stem's two stride-2 layers.
    assert!(ResNetConfig::cifar().with_input_size(16).validate().is_ok());
    let bad = ResNetConfig::new().with_input_size(16);
    assert_eq!(
        bad.validate().unwrap_err().to_string(),
        "input_size must be in 32..=2048 with the imagenet stem, got 16"
    );
    let bad = ResNetConfig::cifar().with_input_size(4);
    assert_eq!(
        bad.validate().unwrap_err(),
        ResNetError::InputSize {
            size: 4,
            stem: Stem::Cifar
        }
    );
    let bad = ResNetConfig::cifar().with_num_classes(0);
    assert_eq!(
        bad.validate().unwrap_err().to_string(),
        "num_classes must be in 1..=100000, got 0"
    );
}

/// Every model's plan (what the memory estimate walks) has the parameters `init` builds: the
/// same layers, in any width, stem and depth.
#[test]
fn plans_count_the_parameters_init_builds() {
    let device = Default::default();
    let count = |plan: oomlab_engine::Plan| (plan.weights() + plan.batch_norm()) as usize;
    for fuse in [false, true] {
        let simple = SimpleModelConfig::new().with_fuse(fuse);
        let built = simple.init::<Flex>(&device).trainable_params();
        assert_eq!(count(simple.plan()), built, "SimpleModel, fuse {fuse}");
        for width in [0.25, 1.0] {
            let mobile = MobileNetConfig::cifar()
                .with_width_multiplier(width)
                .with_fuse(fuse);
            let built = mobile.init::<Flex>(&device).unwrap().trainable_params();
            assert_eq!(
                count(mobile.plan()),
                built,
                "MobileNet α {width}, fuse {fuse}"
            );
        }
        for (depth, stem, width) in [
            (18, Stem::Cifar, 0.5),
            (34, Stem::Cifar, 0.25),
            (50, Stem::Imagenet, 1.0),
            (18, Stem::Imagenet, 1.0),
        ] {
            let resnet = ResNetConfig::new()
                .with_depth(depth)
                .with_stem(stem)
                .with_width_multiplier(width)
                .with_fuse(fuse);
            let built = resnet.init::<Flex>(&device).unwrap().trainable_params();
            let what = format!("ResNet-{depth} {stem:?} α {width}, fuse {fuse}");
            assert_eq!(count(resnet.plan()), built, "{what}");
        }
    }
}
